"""Tiny BERT-class checkpoints written by transformers (random weights, float32) with a
WordPiece (BERT) or byte-level BPE (RoBERTa, XLM-R) tokenizer trained on the tiny
models' corpus, as such models ship: `[CLS] a [SEP] b [SEP]` pairs with token types
for BERT, `<s> a </s></s> b </s>` for RoBERTa.

`make_encoder_model(path, kind, task=..., pooling=..., normalize=..., num_labels=...)`:
kind "bert", "roberta" or "xlm-roberta"; task "embed" (the bare `*Model`, with
sentence-transformers' pooling files) or "classify" (`*ForSequenceClassification`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.pooling_models import write_sentence_transformers_files
from tests.tiny_models import CORPUS, cached_build

VOCAB = 600
_ARCH = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}


def make_encoder_model(path: str | Path, kind: str = "bert", *, task: str = "embed",
                       pooling: str = "cls", normalize: bool = True, num_labels: int = 1,
                       seed: int = 0, hidden_act: str = "gelu") -> Path:
    import torch
    import transformers

    path = Path(path)
    path.mkdir(parents=True)
    tokenizer = _write_tokenizer(path, kind)
    config_class = getattr(transformers, f"{_ARCH[kind]}Config")
    config = config_class(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=256 if kind == "bert" else 258,
        type_vocab_size=2 if kind == "bert" else 1, hidden_act=hidden_act,
        pad_token_id=tokenizer.token_to_id("[PAD]" if kind == "bert" else "<pad>"),
        num_labels=num_labels)
    torch.manual_seed(seed)
    suffix = "ForSequenceClassification" if task == "classify" else "Model"
    model = getattr(transformers, f"{_ARCH[kind]}{suffix}")(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name and p.dim() == 2:
                # Wider than BERT's 0.02 init: tokens then differ in what they attend to.
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5 * 4)
    model.save_pretrained(str(path))
    # Released BERT-class checkpoints name their position embeddings' kind (vLLM's
    # XLM-R config hook reads it); transformers 5 no longer writes it.
    config_path = path / "config.json"
    saved = json.loads(config_path.read_text())
    saved.setdefault("position_embedding_type", "absolute")
    config_path.write_text(json.dumps(saved, indent=1))
    if task == "embed":
        write_sentence_transformers_files(path, config.hidden_size, pooling, normalize)
    return path


def cached_encoder_model(kind: str = "bert", **kwargs: Any) -> Path:
    return cached_build(make_encoder_model, kind, kwargs)


def _write_tokenizer(path: Path, kind: str):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    texts = CORPUS.split("\n\n")
    if kind == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(texts, trainers.WordPieceTrainer(
            vocab_size=VOCAB, special_tokens=specials, show_progress=False))
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
        config = {"tokenizer_class": "BertTokenizer", "cls_token": "[CLS]",
                  "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                  "mask_token": "[MASK]", "do_lower_case": True}
    else:
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=VOCAB, special_tokens=specials, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.post_processor = processors.RobertaProcessing(
            ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                  "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
                  "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>"}
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {**config, "model_max_length": 512}))   # past the positions: the engine must stop
    return tok
