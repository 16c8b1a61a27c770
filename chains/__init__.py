"""LCEL chain builders over LangChain's contracts: rewrite, retrieve, answer, and the chat and
ask chains that compose them (``ragchains.create_chat_chain`` and friends)."""
