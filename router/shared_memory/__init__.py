"""Shared memory the router keeps track of: regions clients registered (``client_regions``), blocks of
other processes' arenas it keeps alive (``held_blocks``), and the release flags it lends with them
(``loans``). See the shared-memory table in ARCHITECTURE.md."""
