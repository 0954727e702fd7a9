"""What happens to the workers the router knows: workers joining, loading and disappearing
(``membership``), leaving on purpose (``drain``), and model instances placed on them (``placement``).
The pool itself and its liveness are ``router/pool.py``, below the handlers' shared context."""
