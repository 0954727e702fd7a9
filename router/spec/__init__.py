"""What a model is before the router runs it: the spec read from its directory (``model_spec``), its
registry key (``namespaces``), and every check a config must pass to load (``validate``, chaining the
checks of ``queue_policy``, ``adaptive``, ``engine_placement``, ``overload``, ``ensemble_plan`` and those in
``conveyor.proto``). Depends on ``conveyor.proto`` only, and the rest of the router builds on it: the
repository scan makes specs, the registry builds state from them, the schedulers read their parameters
here (the import contracts in pyproject.toml keep it so)."""
