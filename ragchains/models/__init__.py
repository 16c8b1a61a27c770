"""The chat models: their providers (``providers``: OpenAI-compatible servers, and what a
model's failure means; ``embedded``: the llama.cpp model in the process), the first-come
queue their calls take turns in (``queue``), the chat model that takes them (``queued``) and
the hand-off of a call's output from the work that produces it to its reader (``relay``).

The chains see a LangChain chat model and an ``LLM`` describing it (``chains.llm``), nothing
of how its calls are scheduled; the serving layer opens a request's ticket and admits it to
the queue (``serving.admission``).
"""
