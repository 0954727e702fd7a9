"""Model lifecycle: Triton's model control modes, load / unload / reload, and
repository polling. ``ModelLifecycle`` is made of one part per concern, all over the
state ``loads.py`` keeps:

- ``loads.py`` (``ModelLoads``): the state, and how a load is prepared by the repository
  agent and applied, how an unload cancels what is still being prepared;
- ``calls.py`` (``RepositoryCalls``): the model repository extension's calls (load,
  unload, the index, repository registration) and the control mode they need;
- ``polling.py`` (``StartupAndPolling``): start-up's loads and POLL mode;
- ``settling.py`` (``Settling``): staged reloads swapped in, calls answered, retired
  instances picked for unloading;
- ``records.py`` (what the parts pass each other), ``entry_state.py`` (what a model
  entry's versions say about it).

Reload without loss: a model that is already serving is reloaded into
``registry.staging``; its old entry keeps serving until every new version is
READY, then the two swap and the old entry retires (it finishes its queued and
running requests, then its instances are unloaded). A reload that fails leaves
the old model serving, as Triton documents. A model that was not serving loads
in place. ``settle`` is called after every event that can change an instance's
state and returns what the router must do: answer waiting calls, unload
instances.

This runs on the router's loop, so nothing here waits on a disk, a network or a child
process. What does (listing and mirroring the repositories, reading a model and
completing its config, fingerprinting its files) is asked of the repository agent
(``router/repository/agent.py`` runs ``router/repository/prepare.py``), and its results
are applied here when they come back. So:

- loads of different models are prepared in parallel, on ``--model-load-thread-count``
  threads, while every other model keeps serving;
- the loads of one model are prepared one after the other, in the order asked: a second
  load of a model waits for the first's preparation, and the calls are answered once the
  model settles with the newest files;
- an unload is applied at once; a load of that model still being prepared is cancelled
  (its result is dropped when it comes) and its call answered CANCELLED.
"""

from __future__ import annotations

from conveyor.router.lifecycle.calls import RepositoryCalls, check_model_name
from conveyor.router.lifecycle.polling import StartupAndPolling
from conveyor.router.lifecycle.records import Answer, ControlMode, LoadWaiter, ModelControlConfig, Prep, Settled, Why
from conveyor.router.lifecycle.settling import Settling

__all__ = [
    "Answer", "ControlMode", "LoadWaiter", "ModelControlConfig", "ModelLifecycle", "Prep", "Settled", "Why",
    "check_model_name",
]


class ModelLifecycle(RepositoryCalls, StartupAndPolling, Settling):
    """The router's one lifecycle: its constructor is ``ModelLoads.__init__``."""
