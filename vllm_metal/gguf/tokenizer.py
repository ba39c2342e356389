"""GGUF tokenizer metadata -> HF fast-tokenizer files (tokenizer.json and its configs).

Two vocabularies exist in llama.cpp files: `gpt2` (byte-level BPE: tokens + merges) and
`llama` (SentencePiece: tokens + scores, byte fallback). Both become a `tokenizers` BPE.
Token types follow llama.cpp: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
6 byte.
"""

from __future__ import annotations

import logging
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors

logger = logging.getLogger("vllm_metal")

_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4
_SPACE = "\u2581"  # SentencePiece's visible space

# Split regexes of llama.cpp's pre-tokenizer types (`tokenizer.ggml.pre`), applied in
# order (each splits the pieces of the last, keeping the matches); none: GPT-2's own.
# They are the tokenizers' own published patterns (their tokenizer.json files).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"


def _cased_words(suffix: str) -> str:
    """Words split at lower-to-upper case changes (o200k and Tekken), then `suffix`."""
    lead = r"[^\r\n\p{L}\p{N}]?"
    return f"{lead}{_UPPER}*{_LOWER}+{suffix}|{lead}{_UPPER}+{_LOWER}*{suffix}"


_O200K = (_cased_words(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?")
          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (_cased_words("")
           + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3 = (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
              r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
              r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    **{name: (_LLAMA3,) for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                     "pixtral", "midm-2.0", "lfm2", "smaug-bpe", "dbrx",
                                     "chatglm-bpe", "glm4")},
    **{name: (_QWEN2,) for name in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez")},
    **{name: (_O200K,) for name in ("gpt-4o", "minimax-m2")},  # gpt-oss files say gpt-4o
    "tekken": (_TEKKEN,),
    **{name: _DEEPSEEK3 for name in ("deepseek-v3", "hunyuan-dense")},
    # GPT-2's regex after isolating every digit.
    **{name: (r"\p{N}",) for name in
       ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")},
    **{name: () for name in ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais")},
}
# For these llama.cpp adds BOS by default and looks a whole pre-token up in the vocabulary
# before merging (ignore_merges).
_LLAMA3_DEFAULTS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                    "midm-2.0", "lfm2"}


def build_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """A `tokenizers.Tokenizer` equivalent to the GGUF's vocabulary."""
    kind = metadata.get("tokenizer.ggml.model")
    if "tokenizer.ggml.tokens" not in metadata:
        raise ValueError("GGUF has no tokenizer.ggml.tokens; it carries no tokenizer")
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(metadata)
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(metadata)
    else:
        raise ValueError(
            f"GGUF tokenizer model {kind!r} is not supported; supported: 'gpt2' "
            "(byte-level BPE) and 'llama' (SentencePiece)")
    _add_special_tokens(tokenizer, metadata)
    _set_post_processor(tokenizer, metadata)
    return tokenizer


def tokenizer_files(metadata: dict[str, Any]) -> dict[str, Any]:
    """{"tokenizer.json": str, "tokenizer_config.json": dict, "special_tokens_map.json": dict}."""
    tokens = metadata["tokenizer.ggml.tokens"]
    special = {}
    for hf_name, key in (("bos_token", "bos"), ("eos_token", "eos"),
                         ("unk_token", "unknown"), ("pad_token", "padding")):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            special[hf_name] = tokens[token_id]
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": add_bos_token(metadata),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
    }
    context = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    if context is not None:
        config["model_max_length"] = int(context)
    if metadata.get("tokenizer.chat_template"):
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return {
        "tokenizer.json": build_tokenizer(metadata).to_str(),
        "tokenizer_config.json": config,
        "special_tokens_map.json": special,
    }


def add_bos_token(metadata: dict[str, Any]) -> bool:
    """tokenizer.ggml.add_bos_token, else llama.cpp's default for the vocabulary."""
    if "tokenizer.ggml.add_bos_token" in metadata:
        return bool(metadata["tokenizer.ggml.add_bos_token"])
    return (metadata.get("tokenizer.ggml.model") == "llama"
            or metadata.get("tokenizer.ggml.pre") in _LLAMA3_DEFAULTS)


def _types(metadata: dict[str, Any]) -> list[int]:
    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError("GGUF tokenizer.ggml.token_type and tokens differ in length")
    return types


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)  # a repeated string keeps its first id
    if len(vocab) != len(tokens):
        logger.warning("GGUF vocabulary repeats %d token strings; later copies are unreachable",
                       len(tokens) - len(vocab))
    return vocab


def _byte_level_bpe(metadata: dict[str, Any]) -> Tokenizer:
    tokens, types = metadata["tokenizer.ggml.tokens"], _types(metadata)
    byte_char = _bytes_to_unicode()
    alphabet = set(byte_char.values())
    # Ordinary tokens outside the byte alphabet are respelled so BPE can reach them;
    # control/user-defined tokens stay raw: they are matched whole in the text.
    spelled = [
        t if types[i] in (_CONTROL, _USER_DEFINED) or set(t) <= alphabet
        else "".join(byte_char[b] for b in t.encode("utf-8"))
        for i, t in enumerate(tokens)
    ]
    merges = []
    for merge in metadata.get("tokenizer.ggml.merges") or []:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"GGUF merge {merge!r} is not two space-separated tokens")
        merges.append((parts[0], parts[1]))
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_SPLITS:
        # Splitting text another way would give other token ids: a silent wrong answer.
        raise ValueError(
            f"GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported by vllm-metal; "
            f"supported: {', '.join(sorted(_PRE_SPLITS))}")
    regexes = _PRE_SPLITS[pre]

    bpe = models.BPE(_vocab(spelled), merges, ignore_merges=pre in _LLAMA3_DEFAULTS)
    tokenizer = Tokenizer(bpe)
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    if regexes and regexes[-1] != r"\p{N}":
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    else:  # GPT-2's own regex (after isolating digits, for some)
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tokenizer.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(metadata: dict[str, Any]) -> Tokenizer:
    tokens, types = metadata["tokenizer.ggml.tokens"], _types(metadata)
    scores = metadata.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ValueError("GGUF SentencePiece vocabulary needs one tokenizer.ggml.scores per token")
    vocab = _vocab(tokens)
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    bpe = models.BPE(vocab, _merges_from_scores(tokens, types, scores, vocab),
                     unk_token=unk, fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(bpe)
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    # llama.cpp prefixes a space to every text run (also after a special token), as
    # HF's legacy Llama normalizer does; spaces become the visible space symbol.
    steps = [normalizers.Prepend(_SPACE)] if prefix else []
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPACE)])
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
        *([decoders.Strip(" ", 1, 0)] if prefix else []),
    ])
    return tokenizer


def _merges_from_scores(
    tokens: list[str], types: list[int], scores: list[float], vocab: dict[str, int],
) -> list[tuple[str, str]]:
    """SentencePiece BPE merges: every split of a normal piece into two known pieces,
    ranked by the merged piece's score (higher merges first), then left to right."""
    ranked = []
    for index, token in enumerate(tokens):
        if types[index] != 1 or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _add_special_tokens(tokenizer: Tokenizer, metadata: dict[str, Any]) -> None:
    tokens, types = metadata["tokenizer.ggml.tokens"], _types(metadata)
    sentencepiece = metadata.get("tokenizer.ggml.model") == "llama"
    special_types = (_CONTROL, _UNKNOWN) if sentencepiece else (_CONTROL,)
    special = [AddedToken(t, special=True, normalized=False)
               for t, kind in zip(tokens, types) if kind in special_types]
    user = [AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types) if kind == _USER_DEFINED]
    if special:
        tokenizer.add_special_tokens(special)
    if user:
        tokenizer.add_tokens(user)


def _set_post_processor(tokenizer: Tokenizer, metadata: dict[str, Any]) -> None:
    tokens = metadata["tokenizer.ggml.tokens"]
    wrap = []
    for key, flag in (("bos", add_bos_token(metadata)),
                      ("eos", metadata.get("tokenizer.ggml.add_eos_token", False))):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        wrap.append((tokens[token_id], token_id) if flag and token_id is not None else None)
    bos, eos = wrap
    if bos is None and eos is None:
        if metadata.get("tokenizer.ggml.model") == "gpt2":
            tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        return
    single = " ".join([*([bos[0]] if bos else []), "$A", *([eos[0]] if eos else [])])
    pair = f"{single} " + single.replace("$A", "$B:1")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[t for t in (bos, eos) if t])


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table
