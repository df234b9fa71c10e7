"""Structured-output rules shared by the engine (paddle_llm_engine.guided) and the OpenAI frontend
(paddle_llm_openai.tools), standard library only, so the frontend imports no Paddle:

- closed_schema.close_schema: a JSON schema in which every object allows only the keys the schema
  names (`additionalProperties: false` where it leaves them open; xgrammar's strict mode).
- json_layout: the bounded JSON whitespace every guided JSON output gets unless the request sets its own.
"""
