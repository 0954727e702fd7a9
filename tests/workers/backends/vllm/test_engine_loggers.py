"""The statistics loggers an engine starts with, given to vLLM's own logger manager."""

from __future__ import annotations

from tests.support import tiny_llama

LEVEL = "slow"

tiny_llama.require_vllm()


def test_the_engine_makes_no_prometheus_series_and_no_logger_where_statistics_are_off() -> None:
    # vLLM makes a Prometheus logger for each engine unless given one, unregistering and registering the
    # process's series: two engines of one worker starting at once failed the second (DuplicateTimeseries).
    import prometheus_client
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import StatLoggerManager

    from conveyor.workers.backends.vllm.engine import engine_loggers

    before = set(prometheus_client.REGISTRY._names_to_collectors)
    managers = [StatLoggerManager(VllmConfig(), engine_idxs=[0], custom_stat_loggers=engine_loggers({}, []),
                                  enable_default_loggers=False) for _ in range(2)]
    assert [[type(lg).__name__ for lg in m.stat_loggers] for m in managers] == [["NoPrometheus"]] * 2
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before
    # vLLM turns statistics on for any logger it is given: none where the model turns them off.
    assert engine_loggers({"disable_log_stats": True}, [object]) is None
