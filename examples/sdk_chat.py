"""Chat with the default model from Python, without a server.

Run it with the Python that has Kronk installed: after the README's `nox -s serve`,
`source .nox/serve/bin/activate`, then:

    python examples/sdk_chat.py
"""

from __future__ import annotations

import asyncio

from kronk_core import Kronk


async def main() -> None:
    with Kronk() as kronk:
        messages = [{"role": "user", "content": "Write a haiku about the sea."}]
        print("streaming: ", end="", flush=True)
        async for delta in kronk.chat_stream(messages, max_tokens=48, temperature=0):
            print(delta.content, end="", flush=True)
            if delta.usage is not None:
                print(f"\n[{delta.finish_reason}, {delta.usage.completion_tokens} tokens]")
        result = await kronk.chat(messages, max_tokens=48, temperature=0)
        print(f"whole answer: {result.content!r}")


if __name__ == "__main__":
    asyncio.run(main())
