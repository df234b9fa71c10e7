"""The transports between our processes: the engine channel (how the `ensemble` model reaches the
engines of the `llm` instances without Triton's decoupled BLS), the control bus, and the abstract
Unix socket names both bind.

Why not BLS: in Triton 2.51's Python backend (and its main branch as read), a stub that runs several
decoupled BLS streams from several threads deadlocks. The thread that creates a new BLS response
iterator holds the GIL and waits for the stub's iterator-map mutex; the stub's ParentToStub monitor
thread holds that mutex and waits for one iterator's own mutex; the thread consuming that iterator
holds the iterator's mutex and waits for the GIL (ResponseIterator::Next re-takes the GIL with its
mutex held). Every decoupled BLS stream of the ensemble stub then stops, tritonserver's threads that
deliver `llm` responses into it block, and `llm`'s response thread blocks behind them: one wedged
caller stops every client of the model (docs/operations/reliability.md has the stacks).

So each `llm` instance listens on a Unix stream socket in the abstract namespace (address.py), and
the ensemble opens one connection per engine request: a `generate` frame in, output frames back,
the connection closed after the final one (wire.py has the framing, protocol.py the
messages). Closing the connection, or an `abort` frame, aborts the request; a peer that dies is an
end of file on the other side, so neither side can wedge the other: the llm instance aborts the
requests of a dead ensemble (their KV blocks are freed), the ensemble fails the requests of a dead
llm instance at once with an error naming it.

- server.py: `ChannelServer`, one selector thread in each llm stub (no pb_utils call on it).
- client.py: `ChannelClient` (instance discovery, least-loaded choice) and `ChannelStream`, used by
  the ensemble's request threads.
- protocol.py: the messages on the channel; both sides (ensemble/ and llm/) import it, so neither
  room imports the other.
- control_bus.py: datagrams between the stubs of one server and the launcher (`stop` ids among the
  llm instances, the launcher's `drain` / `status`).
- unix_names.py: the abstract socket names all of these bind, read back from /proc/net/unix, and the
  same-user check every receiver makes.
"""
