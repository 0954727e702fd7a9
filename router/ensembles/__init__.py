"""Ensemble models, run by the router itself: the DAG read from the config (``plan``), its readiness
(``state``), the scheduler that walks each request through it (``scheduler``, ``levels``, ``branch``,
``conditions``), and the socket its steps are sent on (``self_link``)."""
