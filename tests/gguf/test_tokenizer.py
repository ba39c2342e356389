"""Tokenizers built from GGUF metadata vs transformers' GGUF tokenizer and sentencepiece."""

from __future__ import annotations

import io

import pytest

from tests.gguf.reference import transformers_gguf_tokenizer
from tests.gguf.sample_texts import TEXTS
from tests.tiny_models import CORPUS
from vllm_metal.gguf.header import read_header
from vllm_metal.gguf.tokenizer import build_tokenizer, tokenizer_files

SMOLLM2_SPECIAL = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
# Non-ASCII numerals: llama.cpp's "smollm" pre-tokenizer (and SmolLM2's own tokenizer.json)
# isolate every \p{N} character; transformers' GGUF tokenizer does not.
NUMERALS = "fractions ½ ¾ and powers x² y³, Roman Ⅻ, Arabic ٣٤٥"


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    return build_tokenizer(read_header(smollm2_path).metadata)


@pytest.mark.parametrize("text", [*TEXTS, SMOLLM2_SPECIAL])
def test_smollm2_ids_match_transformers(smollm2_tokenizer, smollm2_hf_tokenizer, text):
    assert smollm2_tokenizer.encode(text).ids == smollm2_hf_tokenizer.encode(text)


@pytest.mark.parametrize("text", [*TEXTS, SMOLLM2_SPECIAL, NUMERALS])
def test_smollm2_decode_round_trips(smollm2_tokenizer, smollm2_hf_tokenizer, text):
    ids = smollm2_tokenizer.encode(text).ids
    assert smollm2_tokenizer.decode(ids, skip_special_tokens=False) == text
    assert smollm2_hf_tokenizer.decode(ids) == text


def test_smollm2_numerals_split_like_smollm2_pre_tokenizer(smollm2_tokenizer,
                                                           smollm2_hf_tokenizer):
    from tokenizers import Tokenizer, pre_tokenizers

    # transformers' GGUF tokenizer with the pre-tokenizer SmolLM2's tokenizer.json declares.
    reference = Tokenizer.from_str(smollm2_hf_tokenizer.backend_tokenizer.to_str())
    reference.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    for text in (*TEXTS, NUMERALS):
        assert smollm2_tokenizer.encode(text).ids == reference.encode(text).ids


def test_smollm2_special_tokens_are_whole(smollm2_tokenizer, smollm2_path):
    metadata = read_header(smollm2_path).metadata
    tokens = metadata["tokenizer.ggml.tokens"]
    ids = smollm2_tokenizer.encode(SMOLLM2_SPECIAL).ids
    assert ids[0] == tokens.index("<|im_start|>")
    assert ids.count(tokens.index("<|im_end|>")) == 1


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "smollm", "gpt2", "dbrx", "refact",
                                 "starcoder"])
def test_pre_tokenizer_types_match_transformers(tiny_gguf, pre):
    path = tiny_gguf("llama", "F32", pre=pre)
    ours = build_tokenizer(read_header(path).metadata)
    reference = transformers_gguf_tokenizer(path)
    for text in TEXTS:
        # The tiny file asks for a BOS token; transformers ignores add_bos_token here.
        assert ours.encode(text, add_special_tokens=False).ids == reference.encode(
            text, add_special_tokens=False), text


def test_pre_tokenizer_digit_grouping(tiny_gguf):
    def words(pre):
        tokenizer = build_tokenizer(read_header(tiny_gguf("llama", "F32", pre=pre)).metadata)
        return [w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str("x 1234567")]

    assert words("llama-bpe") == ["x", "Ġ", "123", "456", "7"]
    assert words("qwen2") == ["x", "Ġ", "1", "2", "3", "4", "5", "6", "7"]
    assert words("gpt2") == ["x", "Ġ1234567"]


@pytest.mark.parametrize("pre,words", [
    # o200k (gpt-oss): case changes split words, contractions stay on their word, digits
    # in threes, a punctuation run takes the letters after it.
    ("gpt-4o", ["Hello", "World", "Ġit's", "Ġ", "123", "456", "7", "Ġx", "/y", "ĠOK", "!!"]),
    # DeepSeek-V3: digits in threes first, a punctuation mark leads the letters after it.
    ("deepseek-v3", ["HelloWorld", "Ġit", "'s", "Ġ", "123", "456", "7", "Ġx", "/y", "ĠOK",
                     "!!"]),
    # Tekken (Mistral Nemo): o200k's case split, every digit alone, no contractions.
    ("tekken", ["Hello", "World", "Ġit", "'s", "Ġ", "1", "2", "3", "4", "5", "6", "7", "Ġx",
                "/y", "ĠOK", "!!"]),
])
def test_pre_tokenizer_schemes_split_as_their_patterns_do(tiny_gguf, pre, words):
    tokenizer = build_tokenizer(read_header(tiny_gguf("llama", "F32", pre=pre)).metadata)
    text = "HelloWorld it's 1234567 x/y OK!!"
    assert [w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)] == words


def test_deepseek_v3_isolates_cjk_runs(tiny_gguf):
    path = tiny_gguf("llama", "F32", pre="deepseek-v3")
    tokenizer = build_tokenizer(read_header(path).metadata)
    words = tokenizer.pre_tokenizer.pre_tokenize_str("ab 日本語テキスト")
    assert len(words) == 3  # ab, the space, the run


def test_an_unknown_pre_tokenizer_is_refused_by_name(tiny_gguf):
    metadata = dict(read_header(tiny_gguf("llama", "F32")).metadata)
    metadata["tokenizer.ggml.pre"] = "kimi-k2"
    with pytest.raises(ValueError, match=r"'kimi-k2' \(tokenizer.ggml.pre\) is not supported"):
        build_tokenizer(metadata)


def test_byte_level_adds_bos_when_the_file_asks(tiny_gguf):
    metadata = read_header(tiny_gguf("llama", "F32")).metadata
    ids = build_tokenizer(metadata).encode("Hello").ids
    assert metadata["tokenizer.ggml.add_bos_token"] is True
    assert ids[0] == metadata["tokenizer.ggml.bos_token_id"]


def _sentencepiece_gguf(path, space_prefix=True):
    """A GGUF holding a SentencePiece BPE vocabulary the way llama.cpp converts one
    (`space_prefix` False: as Gemma's, trained without a dummy prefix)."""
    import gguf
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.split("\n")), model_writer=model, vocab_size=600,
        model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=space_prefix, split_digits=True,
        character_coverage=1.0, allow_whitespace_only_pieces=True, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i)
             else 6 if sp.is_byte(i) else 1 for i in range(n)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.id_to_piece(i) for i in range(n)])
    writer.add_token_scores([sp.get_score(i) for i in range(n)])
    writer.add_token_types(types)
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_add_space_prefix(space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sp


@pytest.fixture(scope="module")
def sentencepiece_case(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "spm.gguf"
    sp = _sentencepiece_gguf(path)
    return path, sp, build_tokenizer(read_header(path).metadata)


@pytest.mark.parametrize("text", [*TEXTS, "  two leading spaces"])
def test_sentencepiece_without_space_prefix_matches_sentencepiece(tmp_path_factory, text):
    """Gemma's vocabularies: the converter writes add_space_prefix = False."""
    path = tmp_path_factory.mktemp("spm-no-prefix") / "spm.gguf"
    sp = _sentencepiece_gguf(path, space_prefix=False)
    ours = build_tokenizer(read_header(path).metadata)
    ids = ours.encode(text, add_special_tokens=False).ids
    assert ids == sp.encode(text)
    assert ours.decode(ids) == text


@pytest.mark.parametrize("text", [*TEXTS, "  two leading spaces"])
def test_sentencepiece_ids_match_sentencepiece(sentencepiece_case, text):
    _, sp, ours = sentencepiece_case
    ids = ours.encode(text, add_special_tokens=False).ids
    assert ids == sp.encode(text)
    assert ours.decode(ids) == text


def test_sentencepiece_control_tokens_in_text(sentencepiece_case):
    _, sp, ours = sentencepiece_case
    # Control tokens in text are matched whole (HF convention; sentencepiece itself
    # spells them out), and the text after one gets a space prefix, as in llama.cpp.
    ids = ours.encode("<s>Hi there</s>", add_special_tokens=False).ids
    assert ids == [sp.bos_id(), *sp.encode("Hi there"), sp.eos_id()]


def test_sentencepiece_matches_transformers_and_adds_bos(sentencepiece_case):
    path, sp, ours = sentencepiece_case
    reference = transformers_gguf_tokenizer(path)
    for text in TEXTS[:9]:
        assert ours.encode(text, add_special_tokens=False).ids == reference.encode(
            text, add_special_tokens=False)
    # llama.cpp adds BOS to SentencePiece vocabularies unless the file says otherwise.
    assert ours.encode("Hello").ids[0] == sp.bos_id()


def test_tokenizer_config_from_metadata(smollm2_path):
    metadata = read_header(smollm2_path).metadata
    files = tokenizer_files(metadata)
    config, special = files["tokenizer_config.json"], files["special_tokens_map.json"]
    tokens = metadata["tokenizer.ggml.tokens"]
    assert config["bos_token"] == tokens[metadata["tokenizer.ggml.bos_token_id"]]
    assert config["eos_token"] == tokens[metadata["tokenizer.ggml.eos_token_id"]]
    assert config["pad_token"] == tokens[metadata["tokenizer.ggml.padding_token_id"]]
    assert config["unk_token"] == tokens[metadata["tokenizer.ggml.unknown_token_id"]]
    assert config["add_bos_token"] is metadata["tokenizer.ggml.add_bos_token"]
    assert config["chat_template"] == metadata["tokenizer.chat_template"]
    assert config["model_max_length"] == metadata["llama.context_length"]
    assert special == {k: config[k] for k in special}


@pytest.mark.parametrize("change,message", [
    ({"tokenizer.ggml.model": "bert"}, "'bert'.*'gpt2'.*'llama'"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.merges": ["a b c"]}, "'a b c'"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "token_type"),
])
def test_bad_tokenizer_metadata_is_refused(tiny_gguf, change, message):
    metadata = dict(read_header(tiny_gguf("llama", "F32")).metadata)
    metadata.update(change)
    metadata = {k: v for k, v in metadata.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        build_tokenizer(metadata)
