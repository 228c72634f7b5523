"""Streaming detokenization gives exactly the text of a full decode, one complete character at a time."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from enginetest_tiny import build_tokenizer

from engine.sampling import IncrementalDetokenizer

TEXTS = [
    "café naïve 東京 🙂 résumé",
    " leading space, two  spaces\nand a new line",
    "family 👩‍👩‍👧, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, Ελληνικά, русский",
]


def _byte_level(tmp_path: Path):
    """GPT-2/SmolLM2-style: byte-level BPE (a multi-byte character spans several tokens)."""
    return build_tokenizer(tmp_path)


def _sentencepiece_style(tmp_path: Path):
    """Llama-2/Mistral-style: Metaspace word boundaries with byte fallback and a stripped first space."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["The quick brown fox jumps over the lazy dog.", "café naïve résumé, Ελληνικά, русский."] * 20
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizer
    trained.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    vocab_file, merges_file = trained.model.save(str(tmp_path))
    vocab = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
    for i in range(256):  # ordinary (not special) byte tokens, as in Llama 2: unknown characters fall back to them
        vocab.setdefault(f"<0x{i:02X}>", len(vocab))
    Path(vocab_file).write_text(json.dumps(vocab), encoding="utf-8")
    tok = Tokenizer(models.BPE.from_file(vocab_file, merges_file, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("make", [_byte_level, _sentencepiece_style])
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_decode_at_every_step(make, text: str, tmp_path: Path) -> None:
    tokenizer = make(tmp_path)
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    shown = ""
    deltas = []
    for i, token_id in enumerate(ids):
        deltas.append(detok.add(token_id))
        shown += deltas[-1]
        assert "\ufffd" not in deltas[-1]
        assert text.startswith(shown)
        so_far = _decode(tokenizer, ids[: i + 1])
        if not so_far.endswith("\ufffd"):  # complete characters so far: all of them are shown
            assert shown == so_far
    assert shown == text
    if not text.isascii():
        assert "" in deltas  # some tokens carried only part of a character


@pytest.mark.parametrize("make", [_byte_level, _sentencepiece_style])
def test_random_ids_and_special_tokens(make, tmp_path: Path) -> None:
    """Whatever a random model samples (special tokens included), the stream shows the full decode.

    Byte-fallback bytes that form no valid UTF-8 are left out here: released text cannot be taken back,
    and the full decode renders such bytes differently once more bytes follow. They must not fail the
    stream though (last loop)."""
    tokenizer = make(tmp_path)
    byte_tokens = {i for t, i in tokenizer.get_vocab().items() if t.startswith("<0x")}
    choices = [i for i in range(len(tokenizer)) if i not in byte_tokens]
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.choice(choices) for _ in range(30)]
        detok = IncrementalDetokenizer(tokenizer)
        shown = "".join(detok.add(i) for i in ids)
        full = _decode(tokenizer, ids)
        if not full.endswith("\ufffd"):
            assert shown == full
        else:  # invalid bytes at the end are held back until a character completes them
            assert full.startswith(shown)
    for _ in range(50):
        detok = IncrementalDetokenizer(tokenizer)
        assert all(isinstance(detok.add(rng.randrange(len(tokenizer))), str) for _ in range(30))


def test_tokenizers_decode_stream_is_no_replacement_for_byte_fallback() -> None:
    """Why IncrementalDetokenizer is not tokenizers' DecodeStream: on the same deltas wherever both work
    (tests above), DecodeStream raises on some invalid byte sequences of a byte-fallback tokenizer, which
    a random or confused model can sample; a stream must not fail mid-answer for that."""
    from tokenizers.decoders import DecodeStream

    tokenizer = _sentencepiece_style(Path(tempfile.mkdtemp()))
    rng = random.Random(0)
    failures = 0
    for _ in range(50):
        ids = [rng.randrange(len(tokenizer)) for _ in range(30)]
        stream = DecodeStream(skip_special_tokens=True)
        try:
            for token_id in ids:
                stream.step(tokenizer.backend_tokenizer, token_id)
        except Exception as exc:  # tokenizers raises a bare Exception: "Invalid prefix encountered …"
            assert "Invalid prefix" in str(exc)
            failures += 1
    assert failures > 0
