#!/usr/bin/env python3
"""Golden renderings of chat conversations by the reference DeepSeek-V4.1 encoder (see
tests/reference/chat_v41/README.md for the revision and the command).

It renders every conversation in tests/reference/chat/ (the V4 inputs, reused) and the V4.1-only
ones in tests/reference/chat_v41/. For each NN-name.json (an OpenAI-style chat request body, or a
bare messages array) it writes, into tests/reference/chat_v41/, NN-name.rendered.txt (the prompt
text, byte for byte) and NN-name.ids.json (its token ids under the bundled tokenizer, encoded by
Hugging Face `tokenizers` without added special tokens); or, when SGLang's request handling or
the encoder refuses the conversation, NN-name.error.txt (the exception class and message).

The encoder (SGLang's python/sglang/srt/entrypoints/openai/encoding_dsv41.py) is imported from the
path given with --encoder; it is not vendored here. The request handling in front of it is
SGLang's V4.1 serving path (serving_chat.py, chat_encoding.py and environ.py at sgl-project/sglang
0e43c22447dcb0c53eee3832c8acba26e491bc94), restated here:
- content null becomes ""; a list of content parts is passed to the encoder as is (no
  flattening: the encoder joins text parts with "\\n\\n" itself);
- string tool-call arguments are parsed into dicts first and must be JSON objects
  (normalize_assistant_tool_call_arguments, strict), else the request is refused;
- an empty system message is inserted first only when the request has tools and the first
  message is not a system message; the tools go on the first message, each function dict
  reduced to the fields the client sent (None dropped) with the keys name, description,
  parameters first (chat_encoding.dsv41_tool_payload);
- thinking from chat_template_kwargs.thinking (default off: SGLANG_DEFAULT_THINKING=False);
- reasoning_effort from chat_template_kwargs.reasoning_effort when present, else the top-level
  field; low/high/xhigh/max pass through, an int budget in [1, 100] (only reachable through
  chat_template_kwargs) passes through, a float in [0, 0.99] becomes min(100, max(1,
  round(100 * v))), anything else falls back to the server default "high"
  (SGLANG_DSV41_REASONING_EFFORT). The top-level field goes through SGLang's pydantic type first:
  a tier string, or a number coerced to float and checked to lie in [0, 0.99].
"""
import argparse
import gzip
import hashlib
import importlib.util
import json
import pathlib
import sys

TIERS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # protocol.py
SERVER_DEFAULT_EFFORT = "high"  # environ.py SGLANG_DSV41_REASONING_EFFORT
FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


class Refused(ValueError):
    """What SGLang's request handling refuses before the encoder runs."""


def load_encoder(path):
    spec = importlib.util.spec_from_file_location("encoding_dsv41", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def top_level_effort(value):
    """ChatCompletionRequest.reasoning_effort: a tier, or a float in [0, 0.99]."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise Refused("reasoning_effort must not be a boolean")
    if isinstance(value, str):
        if value in TIERS:
            return value
        raise Refused(f"invalid reasoning_effort {value!r}")
    value = float(value)
    if not 0.0 <= value <= 0.99:
        raise Refused(f"reasoning_effort {value!r} outside [0.0, 0.99]")
    return value


def resolve_effort(value, mappings):
    """chat_encoding.resolve_dsv41_reasoning_effort, then the server default."""
    if isinstance(value, bool):
        effort = None
    elif isinstance(value, int):
        effort = value if 1 <= value <= 100 else None
    elif isinstance(value, float):
        effort = min(100, max(1, round(value * 100)))
    elif value in mappings:
        effort = value
    else:
        effort = None
    return SERVER_DEFAULT_EFFORT if effort is None else effort


def tool_payload(tool):
    """chat_encoding.dsv41_tool_payload on the pydantic Tool the request parses into."""
    function = {k: v for k, v in tool["function"].items() if k in FUNCTION_FIELDS and v is not None}
    ordered = {k: function.pop(k) for k in ("name", "description", "parameters") if k in function}
    ordered.update(function)
    payload = {k: v for k, v in tool.items() if k in ("type", "defer_loading") and v is not None}
    payload["function"] = ordered
    return payload


def normalize_arguments(message):
    """serving_chat.normalize_assistant_tool_call_arguments(strict=True)."""
    if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
        return
    for call in message["tool_calls"]:
        function = call.get("function")
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                parsed = json.loads(function["arguments"])
            except json.JSONDecodeError as exc:
                raise Refused("Assistant tool call function.arguments must be valid JSON.") from exc
            if not isinstance(parsed, dict):
                raise Refused("Assistant tool call function.arguments must be a JSON object.")
            function["arguments"] = parsed


def encoder_input(body, mappings):
    if isinstance(body, list):
        body = {"messages": body}
    kwargs = dict(body.get("chat_template_kwargs") or {})
    effort = top_level_effort(body.get("reasoning_effort"))
    if kwargs.get("reasoning_effort") is not None:
        effort = kwargs["reasoning_effort"]
    thinking = "thinking" if kwargs.get("thinking", False) else "chat"
    messages = []
    for m in body["messages"]:
        m = json.loads(json.dumps(m))
        if m.get("content") is None:
            m["content"] = ""
        normalize_arguments(m)
        messages.append(m)
    tools = body.get("tools")
    if messages[0]["role"] != "system" and tools:
        messages.insert(0, {"role": "system", "content": ""})
    if tools:
        messages[0]["tools"] = [tool_payload(t) for t in tools]
    return messages, thinking, resolve_effort(effort, mappings)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", required=True, help="path of SGLang's encoding_dsv41.py")
    ap.add_argument("--inputs", nargs="+", default=["tests/reference/chat", "tests/reference/chat_v41"],
                    help="folders whose NN-name.json conversations are rendered")
    ap.add_argument("--out", default="tests/reference/chat_v41")
    ap.add_argument("--tokenizer", default="assets/deepseek-v4-tokenizer.json.gz")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    raw = pathlib.Path(args.tokenizer).read_bytes()
    if args.tokenizer.endswith(".gz"):
        raw = gzip.decompress(raw)
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    enc = load_encoder(args.encoder)
    digest = hashlib.sha256(pathlib.Path(args.encoder).read_bytes()).hexdigest()
    print(f"encoder {args.encoder} sha256 {digest}", file=sys.stderr)
    system_ids = tok.encode(enc.SYSTEM_SP_TOKEN, add_special_tokens=False).ids
    if len(system_ids) != 1:
        print(f"note: {enc.SYSTEM_SP_TOKEN} is not one token under {args.tokenizer}: {system_ids}",
              file=sys.stderr)

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = sorted(
        (p for d in args.inputs for p in pathlib.Path(d).glob("*.json") if not p.name.endswith(".ids.json")),
        key=lambda p: p.name,
    )
    stems = [p.name[: -len(".json")] for p in cases]
    if len(set(stems)) != len(stems):
        sys.exit(f"duplicate conversation names in {args.inputs}")
    for case, stem in zip(cases, stems):
        for suffix in (".rendered.txt", ".ids.json", ".error.txt"):
            (out / f"{stem}{suffix}").unlink(missing_ok=True)
        body = json.loads(case.read_text(encoding="utf-8"))
        try:
            messages, thinking, effort = encoder_input(body, enc.REASONING_EFFORT_MAPPINGS)
            text, media = enc.encode_messages(
                messages, thinking_mode=thinking, reasoning_effort=effort, return_multi_modal_data=True
            )
        except ValueError as exc:
            where = "request handling" if isinstance(exc, Refused) else "encoder"
            name = "ValueError" if isinstance(exc, Refused) else type(exc).__name__
            (out / f"{stem}.error.txt").write_text(f"{where}: {name}: {exc}\n", encoding="utf-8")
            print(f"{stem}: refused by the {where}: {exc}", file=sys.stderr)
            continue
        if media["images"]:
            sys.exit(f"{stem}: image inputs are not supported here")
        ids = tok.encode(text, add_special_tokens=False).ids
        (out / f"{stem}.rendered.txt").write_bytes(text.encode("utf-8"))
        (out / f"{stem}.ids.json").write_text(json.dumps(ids) + "\n")
        print(f"{stem}: {thinking}, effort {effort!r}: {len(text.encode('utf-8'))} bytes, "
              f"{len(ids)} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
