"""When queued requests run: one model version's queues (``priority_queues``, ``queue_policy``), the
batchers that turn them into batches (``batcher``, ``adaptive``, ``sequences``, ``shape_keys``), the rate
limiter, and response ordering."""
