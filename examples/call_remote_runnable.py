"""Call a served ragchains chain with LangServe's RemoteRunnable, choosing the domain per
request. The domains (and prompt versions) to choose from are in the route's config schema.

    ragchains serve --index .index/samples                     # in another terminal
    python examples/call_remote_runnable.py --url http://localhost:8000
"""

from __future__ import annotations

import argparse

import httpx
from langserve import RemoteRunnable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://localhost:8000", help="the ragchains server")
    parser.add_argument("--question", default="What does the standard plan cost?")
    parser.add_argument("--api-key", help="the server's API key, if it has one")
    args = parser.parse_args()
    headers = {"X-API-Key": args.api_key} if args.api_key else {}

    # The choices a request may make, as the server declares them.
    schema = httpx.get(f"{args.url}/chat/config_schema", headers=headers).json()
    choices = schema["$defs"]["Configurable"]["properties"]
    print("domains:", ", ".join(choices["domain"]["enum"]))
    print("answer prompt versions:", ", ".join(choices["answer_version"]["enum"]))
    print("answer styles:", ", ".join(choices["answer_style"]["enum"]))

    chat = RemoteRunnable(f"{args.url}/chat/", headers=headers)
    for domain in ("default", "hr"):
        out = chat.invoke({"question": args.question}, {"configurable": {"domain": domain}})
        cited = ", ".join(c["label"] for c in out["citations"]) or "none"
        print(f"\n[{domain}] {out['answer']}")
        print(f"  prompts: {', '.join(out['prompts'].values())}; cited: {cited}")

    # Streamed: the sources arrive first, then the answer token by token, then citations.
    # Free generation (the embedded model quotes by default) with the answer prompt's v1.
    print("\n[hr, streamed, free, answer prompt v1] ", end="", flush=True)
    config = {"configurable": {"domain": "hr", "answer_style": "free", "answer_version": "v1"}}
    for chunk in chat.stream({"question": args.question}, config):
        if "sources" in chunk:
            print(f"({len(chunk['sources'])} sources) ", end="", flush=True)
        print(chunk.get("answer", ""), end="", flush=True)
        if "prompts" in chunk:
            print(f"\n  prompts: {', '.join(chunk['prompts'].values())}")


if __name__ == "__main__":
    main()
