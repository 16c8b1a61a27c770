"""ragchains: grounded, cited answers over your own documents.

The public builders take LangChain's own parts (any chat model, any ``BaseRetriever``, any
``BaseDocumentCompressor``) and return runnables::

    from ragchains import create_chat_chain
    chat = create_chat_chain(llm=my_chat_model, retriever=my_retriever, compressor=my_reranker)

They are imported on first use, so ``import ragchains`` stays cheap for the command line.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_BUILDERS = {
    "create_chat_chain": "ragchains.chains.graph",
    "create_ask_chain": "ragchains.chains.graph",
    "create_chains": "ragchains.chains.graph",
    "create_rewrite_chain": "ragchains.chains.rewrite",
    "create_retrieve_chain": "ragchains.chains.retrieve",
    "create_answer_chain": "ragchains.chains.answer",
}
__all__ = ["__version__", *_BUILDERS]


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        return getattr(importlib.import_module(_BUILDERS[name]), name)
    raise AttributeError(f"module 'ragchains' has no attribute {name!r}")
