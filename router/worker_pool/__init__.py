"""The workers the router knows and what runs where: the pool and its liveness (``pool``), workers
joining, loading and disappearing (``membership``), leaving on purpose (``drain``), and model instances
placed on them (``placement``)."""
