"""Parity of ferry-tokenize with Hugging Face `tokenizers` on Qwen2-style byte-level BPE.

Two tokenizer.json files are checked on the same >= 1,200 generated strings:
one trained by HF `tokenizers` (proves Ferry reads HF's files the way HF does),
and one written by `ferry-tokenize --train-out` (proves HF accepts Ferry's
trainer output and both sides agree on it). All strings go through one
ferry-tokenize process as JSON lines.
"""

import json
import os
import pathlib
import random
import subprocess
import sys
import unicodedata

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("FERRY_BUILD_DIR", REPO / "build"))
FERRY_TOKENIZE = BUILD_DIR / "bin" / "ferry-tokenize"

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

WORDS = (
    "the quick brown fox jumps over lazy dog serving model token batch cache request "
    "latency throughput scheduler worker gateway stream prefix block kernel memory "
    "it's we'll they're I've don't can't HELLO World Naïve café résumé façade"
).split()
CJK = list("我们的模型今天在服务器上运行得很好中文分词测试数据北京上海日本語のテキスト한국어텍스트")
EMOJI = [
    "😀", "🚀", "🎉", "👍", "👍🏽", "👋🏿", "❤️", "🇯🇵", "👩‍💻", "👨‍👩‍👧‍👦", "🧑🏾‍🚀", "🏳️‍🌈", "✨", "🔥",
]
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u0303", "\u030a", "\u0323", "\u0302"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~…—–«»¿¡·•€£¥")
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\t", "\u3000", "\u00a0", "    "]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "if err != nil {\n  return nil, err\n}",
    "SELECT id, name FROM users WHERE age >= 21;",
    '{"key": [1, 2.5, -3e10], "ok": true}',
    "x = [i**2 for i in range(10)]  # squares",
]


def _word(rng):
    kind = rng.random()
    if kind < 0.55:
        return rng.choice(WORDS)
    if kind < 0.7:
        return "".join(rng.choice(CJK) for _ in range(rng.randint(1, 6)))
    if kind < 0.8:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if kind < 0.9:
        return rng.choice(EMOJI)
    return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 3)))


def make_corpus(seed=7, num_lines=3000):
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        if rng.random() < 0.1:
            lines.append(rng.choice(CODE))
            continue
        words = [_word(rng) for _ in range(rng.randint(3, 20))]
        lines.append(" ".join(words) + rng.choice([".", "!", "?", "", "\n"]))
    return lines


def _random_codepoint(rng):
    while True:
        cp = rng.choice([rng.randint(0x20, 0x2FF), rng.randint(0x300, 0xFFFF), rng.randint(0x10000, 0x10FFFF)])
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def _decomposed(text):
    return unicodedata.normalize("NFD", text)


def _gen_ascii(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))


def _gen_cjk(rng):
    return "".join(rng.choice(CJK + [" ", "，", "。", "、"]) for _ in range(rng.randint(1, 30)))


def _gen_emoji(rng):
    return "".join(rng.choice(EMOJI + [" ", "a", "1"]) for _ in range(rng.randint(1, 10)))


def _gen_combining(rng):
    base = rng.choice(["café", "naïve", "résumé", "Ångström", "jalapeño", "Zoë", "ḍ", "ệ", "한국"])
    forms = [base, _decomposed(base), rng.choice("aeiouAEIOUnc") + rng.choice(COMBINING) + rng.choice(COMBINING)]
    return rng.choice([" ", "", "\n"]).join(rng.choice(forms) for _ in range(rng.randint(1, 4)))


def _gen_whitespace(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        parts.append(rng.choice(SPACES) if rng.random() < 0.6 else rng.choice(WORDS))
    return "".join(parts) + rng.choice(["", " ", "  ", "\n", " \n ", "\t"])


def _gen_digits(rng):
    return rng.choice(["", "x=", "$", "v"]) + str(rng.randint(0, 10 ** 15)) + rng.choice(["", ".5", ",000", "%", " 42"])


def _gen_contraction(rng):
    subject = rng.choice(["it", "IT", "we", "WE", "they", "She", "John"])
    suffix = rng.choice(["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'D", "'x", "’s"])
    return subject + suffix + rng.choice(["", " go", " done.", "\n"])


def _gen_punct(rng):
    return "".join(rng.choice(PUNCT + [" ", "a", "\n"]) for _ in range(rng.randint(1, 15)))


def _gen_special(rng):
    parts = [rng.choice(WORDS), rng.choice(SPECIALS + ["<think>", "naïve", "<|im_end", "|>"])]
    parts.append(rng.choice(["", " ", "\n", "user\n", "\u0301x"]) + rng.choice(WORDS))
    return rng.choice(["", " "]).join(parts)


def _gen_random_unicode(rng):
    return "".join(_random_codepoint(rng) for _ in range(rng.randint(1, 12)))


def _gen_mixed(rng):
    gens = [_gen_ascii, _gen_cjk, _gen_emoji, _gen_combining, _gen_whitespace, _gen_digits, _gen_punct]
    return "".join(rng.choice(gens)(rng) for _ in range(rng.randint(2, 4)))


GENERATORS = [
    _gen_ascii, _gen_cjk, _gen_emoji, _gen_combining, _gen_whitespace, _gen_digits,
    _gen_contraction, _gen_punct, _gen_special, _gen_random_unicode, _gen_mixed,
]


def make_test_strings(seed=1234, per_generator=120):
    rng = random.Random(seed)
    strings = ["", " ", "\n", "\r\n", "  \n\n  ", "a" * 300, " " * 50 + "x", "<|im_start|>user\nhi<|im_end|>"]
    strings += [code for code in CODE]
    for gen in GENERATORS:
        strings += [gen(rng) for _ in range(per_generator)]
    return strings


def train_hf_tokenizer(out_dir):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(make_corpus(), trainer)
    # Non-special added tokens: one matched on raw text, one on NFC text.
    tok.add_tokens([
        AddedToken("<think>", special=False, normalized=False),
        AddedToken("naïve", special=False, normalized=True),
    ])
    path = out_dir / "hf_tokenizer.json"
    tok.save(str(path))
    return path


def run_ferry(tokenizer_path, requests):
    payload = "".join(json.dumps(r) + "\n" for r in requests)
    proc = subprocess.run(
        [str(FERRY_TOKENIZE), "--tokenizer", str(tokenizer_path)],
        input=payload.encode(), capture_output=True, timeout=300, check=True,
    )
    replies = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert len(replies) == len(requests), proc.stderr.decode()
    return replies


def random_id_sequences(vocab_size, seed=99, count=300):
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(rng.randint(1, 12))] for _ in range(count)]


def check_parity(tokenizer_path, strings):
    hf = Tokenizer.from_file(str(tokenizer_path))
    expected_ids = [hf.encode(s, add_special_tokens=False).ids for s in strings]
    got = run_ferry(tokenizer_path, [{"text": s} for s in strings])
    mismatches = [
        f"{s!r}: ferry {g.get('ids', g)} != hf {e}"
        for s, g, e in zip(strings, got, expected_ids) if g.get("ids") != e
    ]
    # Decode HF's ids, plus random ids that split multi-byte characters.
    id_seqs = expected_ids + random_id_sequences(hf.get_vocab_size())
    decoded = run_ferry(tokenizer_path, [{"ids": ids} for ids in id_seqs])
    for ids, reply in zip(id_seqs, decoded):
        want = hf.decode(ids, skip_special_tokens=False)
        if reply.get("text") != want:
            mismatches.append(f"decode {ids}: ferry {reply!r} != hf {want!r}")
    assert not mismatches, f"{len(mismatches)} mismatches, first ones:\n" + "\n".join(mismatches[:15])


@pytest.fixture(scope="module")
def strings():
    if not FERRY_TOKENIZE.exists():
        pytest.skip(f"{FERRY_TOKENIZE} not built (set FERRY_BUILD_DIR)")
    generated = make_test_strings()
    assert len(generated) >= 1200
    return generated


def test_parity_with_hf_trained_tokenizer(tmp_path, strings):
    check_parity(train_hf_tokenizer(tmp_path), strings)


def test_parity_with_ferry_trained_tokenizer(tmp_path, strings):
    path = tmp_path / "ferry_tokenizer.json"
    subprocess.run([str(FERRY_TOKENIZE), "--train-out", str(path), "--vocab-size", "1200"], check=True, timeout=300)
    hf = Tokenizer.from_file(str(path))  # HF must accept the file as written
    assert hf.get_vocab_size() == 1200 + len(SPECIALS)  # the default corpus has pairs enough for 1,200
    for special in SPECIALS:
        assert hf.token_to_id(special) is not None
    check_parity(path, strings)


# Llama 3's own tokenizer, as Meta ships it (llama-models' llama3/tokenizer.model, tiktoken's
# ranks), converted to tokenizer.json by transformers' TikTokenConverter the way
# convert_llama_weights_to_hf.py does: byte-level BPE behind Llama 3's own split pattern (digits in
# runs of up to 3, unlike Qwen2's one at a time), 256 special tokens after the 128,000 merges.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
LLAMA3_SPECIALS += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_SPECIALS))]


def llama3_tokenizer_json(out_dir):
    import importlib.util

    pytest.importorskip("tiktoken")  # TikTokenConverter reads the ranks with it
    spec = importlib.util.find_spec("llama_models")  # located, never imported (its dependencies are not installed)
    if spec is None:
        pytest.skip("llama-models is not installed (scripts/setup.sh installs it)")
    package = pathlib.Path(spec.submodule_search_locations[0]) / "llama3"
    source = (package / "tokenizer.py").read_text()
    assert LLAMA3_PATTERN in source and "num_reserved_special_tokens = 256" in source, "llama-models changed"
    # In a child process: importing transformers' converter loads torch, which aborted this process
    # when an earlier test had already started gRPC's threads (std::system_error at import).
    path = out_dir / "llama3_tokenizer.json"
    convert = (
        "import json, sys\n"
        "from transformers.convert_slow_tokenizer import TikTokenConverter\n"
        "tok = TikTokenConverter(vocab_file=sys.argv[1], pattern=sys.argv[2],\n"
        "                        additional_special_tokens=json.loads(sys.argv[3])).converted()\n"
        "tok.save(sys.argv[4])\n"
    )
    subprocess.run([sys.executable, "-c", convert, str(package / "tokenizer.model"), LLAMA3_PATTERN,
                    json.dumps(LLAMA3_SPECIALS), str(path)], check=True, timeout=300)
    assert Tokenizer.from_file(str(path)).get_vocab_size() == 128256
    return path


def test_parity_with_llama3_tokenizer(tmp_path, strings):
    path = llama3_tokenizer_json(tmp_path)
    check_parity(path, strings + ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
                                  "1234567 digits 12 and 1,234,567.89"])


def test_llama3_post_processor_adds_its_bos(tmp_path, strings):
    """Meta-Llama-3's tokenizer.json as published has this post-processor (ByteLevel, then a template
    putting <|begin_of_text|> before the text): encode(add_special_tokens=True) adds it, and Ferry's
    add_special_tokens gives the same ids."""
    from tokenizers import processors

    path = llama3_tokenizer_json(tmp_path)
    hf = Tokenizer.from_file(str(path))
    hf.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", 128000)]),
    ])
    hf.save(str(path))
    sample = strings[::10]
    expected = [hf.encode(s, add_special_tokens=True).ids for s in sample]
    assert all(ids[0] == 128000 for ids in expected)
    got = run_ferry(path, [{"text": s, "add_special_tokens": True} for s in sample])
    assert [g.get("ids") for g in got] == expected
    plain = run_ferry(path, [{"text": s} for s in sample])
    assert [g.get("ids") for g in plain] == [hf.encode(s, add_special_tokens=False).ids for s in sample]


# Mistral v0.3's own tokenizer (mistral-common's SentencePiece model of Mistral-7B-v0.3, fetched by
# scripts/fetch_reference_data.py), converted to tokenizer.json by transformers' LlamaConverter as
# Hugging Face's files were: SentencePiece-style BPE over characters with byte fallback (<0xXX>),
# unk fused, "▁" for spaces, decoded by Replace, ByteFallback, Fuse and Strip. legacy=True writes
# Prepend and Replace normalizers (Llama 2's files), legacy=False the Metaspace pre-tokenizer
# (prepend_scheme "first"): both forms are in published checkpoints.
MISTRAL_MODEL = REPO / ".venv" / "share" / "ferry-reference" / "mistral-v0.3.model"
MISTRAL_TEXTS = ["[INST] What is 2+2? [/INST]", "<s>[INST] hi [/INST] Hello!</s>", " leading space", "trailing  ",
                 "  two leading", "[TOOL_CALLS] [{\"name\": \"f\"}]", "\u0000\u0001 control bytes \u001f", "tab\tand\nnewline",
                 "unicode 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and emoji 🧑🏾‍🚀 falls back to bytes", "▁ the replacement itself ▁▁"]


def mistral_tokenizer_json(out_dir, legacy):
    if not MISTRAL_MODEL.exists():
        pytest.skip(f"{MISTRAL_MODEL} missing: scripts/setup.sh fetches it from PyPI (mistral-common)")
    pytest.importorskip("sentencepiece")
    path = out_dir / f"mistral_legacy{int(legacy)}.json"
    convert = (
        "import sys\n"
        "from transformers import LlamaTokenizerFast\n"
        "tok = LlamaTokenizerFast(vocab_file=sys.argv[1], legacy=sys.argv[2] == '1', from_slow=True)\n"
        "tok.backend_tokenizer.save(sys.argv[3])\n"
    )
    subprocess.run([sys.executable, "-c", convert, str(MISTRAL_MODEL), str(int(legacy)), str(path)], check=True,
                   timeout=300)
    spec = json.loads(path.read_text())
    assert spec["model"]["byte_fallback"] and len(spec["model"]["vocab"]) == 32768
    assert (spec["pre_tokenizer"] is None) == legacy, spec["pre_tokenizer"]
    return path


@pytest.mark.parametrize("legacy", [True, False], ids=["prepend-replace", "metaspace"])
def test_parity_with_mistral_tokenizer(tmp_path, strings, legacy):
    path = mistral_tokenizer_json(tmp_path, legacy)
    check_parity(path, strings + MISTRAL_TEXTS)
    # Its post-processor puts <s> first: add_special_tokens as Hugging Face's encode.
    hf = Tokenizer.from_file(str(path))
    sample = strings[::10] + MISTRAL_TEXTS
    got = run_ferry(path, [{"text": s, "add_special_tokens": True} for s in sample])
    want = [hf.encode(s, add_special_tokens=True).ids for s in sample]
    assert [g.get("ids") for g in got] == want
    assert all(ids[0] == 1 for ids in want), "the template's BOS"


# The tokenizers ferry-make-model writes for its Llama- and Mistral-shaped models (trained by
# gateway/tokenizer/bpe_trainer.cc in each family's configuration): transformers' library must load
# them as written, and Ferry must encode and decode as it does, the post-processor's BOS included.
@pytest.mark.parametrize("preset,bos", [("tiny-llama", "<|begin_of_text|>"), ("tiny-mistral", "<s>")])
def test_parity_with_make_model_tokenizers(tmp_path, strings, preset, bos):
    make_model = BUILD_DIR / "bin" / "ferry-make-model"
    if not make_model.exists():
        pytest.skip(f"{make_model} not built (set FERRY_BUILD_DIR)")
    subprocess.run([str(make_model), "--preset", preset, "--out", str(tmp_path)], check=True, capture_output=True,
                   timeout=120)
    path = tmp_path / "tokenizer.json"
    hf = Tokenizer.from_file(str(path))
    bos_id = hf.token_to_id(bos)
    assert bos_id is not None
    check_parity(path, strings + MISTRAL_TEXTS)
    sample = strings[::10]
    expected = [hf.encode(s, add_special_tokens=True).ids for s in sample]
    assert all(ids[0] == bos_id for ids in expected)
    got = run_ferry(path, [{"text": s, "add_special_tokens": True} for s in sample])
    assert [g.get("ids") for g in got] == expected
