"""Ensemble models, run by the router itself: its readiness (``state``), the scheduler that walks each
request through it (``scheduler``, ``levels``, ``branch``), and the socket its steps are sent on
(``self_link``). The DAG read from the config and its conditions are the spec's (``router/spec/ensemble_plan.py``,
``ensemble_conditions.py``)."""
