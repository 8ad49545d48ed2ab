#!/usr/bin/env python3
"""Golden renderings of the chat conversations in tests/reference/chat/ by the reference
DeepSeek-V4 encoder (see tests/reference/README.md for the revision and the command).

For each NN-name.json (an OpenAI-style chat request body, or a bare messages array) it writes
NN-name.rendered.txt (the prompt text, byte for byte) and NN-name.ids.json (its token ids under
the bundled V4 tokenizer, encoded by Hugging Face `tokenizers` without added special tokens).

The request handling in front of the encoder is SGLang's serving path (serving_chat.py at
sgl-project/sglang 002897c23becbd522d88b8115a763a21765f978a), restated here: text content
parts joined by one space, null content as "", an empty system message inserted first when the
first message is not a system message, the request's tools on that first message, thinking from
chat_template_kwargs.thinking (default off), reasoning_effort "max"/"high" kept, else None.
"""
import argparse
import gzip
import importlib.util
import json
import pathlib
import sys


def load_encoder(path):
    spec = importlib.util.spec_from_file_location("encoding_dsv4", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flatten(content):
    if content is None:
        return ""
    if isinstance(content, list):
        return " ".join(
            p.get("text", "") for p in content if p.get("type") in ("text", "input_text")
        )
    return content


def encoder_input(body):
    if isinstance(body, list):
        body = {"messages": body}
    messages = []
    for m in body["messages"]:
        m = dict(m)
        m["content"] = flatten(m.get("content"))
        messages.append(m)
    if messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": ""})
    if body.get("tools"):
        messages[0]["tools"] = body["tools"]
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = "thinking" if kwargs.get("thinking", False) else "chat"
    effort = body.get("reasoning_effort", kwargs.get("reasoning_effort"))
    effort = effort if effort in ("max", "high") else None
    return messages, thinking, effort


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--encoder", required=True, help="path of encoding_dsv4.py")
    ap.add_argument("--dir", default="tests/reference/chat")
    ap.add_argument("--tokenizer", default="assets/deepseek-v4-tokenizer.json.gz")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(gzip.open(args.tokenizer).read().decode("utf-8"))
    enc = load_encoder(args.encoder)
    cases = sorted(p for p in pathlib.Path(args.dir).glob("*.json") if not p.name.endswith(".ids.json"))
    for case in cases:
        body = json.loads(case.read_text(encoding="utf-8"))
        messages, thinking, effort = encoder_input(body)
        text = enc.encode_messages(messages, thinking_mode=thinking, reasoning_effort=effort)
        ids = tok.encode(text, add_special_tokens=False).ids
        stem = case.name[: -len(".json")]
        (case.parent / f"{stem}.rendered.txt").write_bytes(text.encode("utf-8"))
        (case.parent / f"{stem}.ids.json").write_text(json.dumps(ids) + "\n")
        print(f"{stem}: {len(text.encode('utf-8'))} bytes, {len(ids)} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
