"""The `ensemble` model's room: TensorRT-LLM's ensemble contract as a decoupled BLS model that runs
preprocessing -> an llm instance's engine -> postprocessing itself (so a client's cancellation
reaches the engine).

- pipeline.py: `EnsemblePipeline`: one thread per client request, its rows, the cancellation watcher
  and TensorRT-LLM's `stop`;
- steps.py: the BLS steps (preprocessing, postprocessing), the inputs it accepts, the engine request
  of a row and TensorRT-LLM's optional outputs;
- requests.py: the state of a client request in flight (ClientRequest, Flight, Row) and its responses.

The engine requests go over engine_channel/ (its protocol.py is what the llm side answers); nothing
here imports the llm room.
"""
