"""An instance's life in Triton, apart from the requests it serves: which instance it is, when it
stops taking requests, when it counts as failed, and what it tells the launcher's supervisor.

- instances.py: this stub's instance name and ordinal among its model's instances (-> device);
- drain.py: refuse new requests, let those in flight finish within a grace period;
- senders.py: every Triton response sender until its FINAL response (what a drain still waits for);
- health.py: the stall watchdog (a step or a response send that does not return fails the engine);
- restarts.py: the supervisor's state folder: restart counts in, failure datagrams out;
- memory_trace.py: opt-in memory-growth diagnostics (PADDLE_LLM_MEMORY_TRACE_S);
- fault_injection.py: TESTS ONLY, an engine that fails on purpose.

Nothing here imports pb_utils or the request rooms (llm/, ensemble/): the launcher imports restarts.py.
"""
