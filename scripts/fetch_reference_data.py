"""Fetches the reference data the parity tests compare Ferry with, from PyPI packages that ship
it, checks each file against its pinned SHA-256, and writes them to OUT_DIR: the published chat
templates (tests/python/test_chat_template_parity.py) and Mistral v0.3's SentencePiece tokenizer
model (tests/python/test_tokenizer_parity.py). Data only: nothing is imported or installed. Exits
0 with a warning when PyPI cannot be reached (the tests then skip, saying why).

  python scripts/fetch_reference_data.py OUT_DIR

Sources (each template as its model repository's tokenizer_config.json has it):
- llama-cpp-python's sdist vendors llama.cpp, whose models/templates/ holds templates fetched from
  the Hugging Face repositories by its scripts/get_chat_template.py: Qwen2.5-7B-Instruct (the same
  template as Qwen2.5-0.5B-Instruct), Qwen3-0.6B, Llama-3.1-8B-Instruct, Llama-3.2-3B-Instruct.
- axolotl's wheel ships Mistral-7B-Instruct-v0.3's template as mistral_v2v3.jinja (its
  Qwen2.5 copy is byte-identical to llama.cpp's, a check on the route).
- mistral-common's wheel ships Mistral's tokenizers; mistral_instruct_tokenizer_240323.model.v3 is
  the SentencePiece model of Mistral-7B(-Instruct)-v0.3 (32,768 tokens), written as
  mistral-v0.3.model (the test converts it to tokenizer.json with transformers).
"""

import hashlib
import os
import re
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile

# (project, file): fetched through PyPI's simple index, checked against the digest it lists.
SDIST = ("llama-cpp-python", "llama_cpp_python-0.3.36.tar.gz")
WHEEL = ("axolotl", "axolotl-0.19.0-py3-none-any.whl")
MISTRAL_WHEEL = ("mistral-common", "mistral_common-1.13.1-py3-none-any.whl")
MISTRAL_MODEL = ("mistral_common/data/mistral_instruct_tokenizer_240323.model.v3",
                 "mistral-v0.3.model")
PREFIX_LLAMA = "vendor/llama.cpp/models/templates/"
PREFIX_AXOLOTL = "axolotl/utils/chat_templates/templates/"

# name: (package, path inside it, sha256)
TEMPLATES = {
    "qwen2.5": ("sdist", PREFIX_LLAMA + "Qwen-Qwen2.5-7B-Instruct.jinja",
                "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f"),
    "qwen3": ("sdist", PREFIX_LLAMA + "Qwen-Qwen3-0.6B.jinja",
              "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"),
    "llama3.1": ("sdist", PREFIX_LLAMA + "meta-llama-Llama-3.1-8B-Instruct.jinja",
                 "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65"),
    "llama3.2": ("sdist", PREFIX_LLAMA + "meta-llama-Llama-3.2-3B-Instruct.jinja",
                 "5816fce10444e03c2e9ee1ef8a4a1ea61ae7e69e438613f3b17b69d0426223a4"),
    "mistral-v0.3": ("wheel", PREFIX_AXOLOTL + "mistral_v2v3.jinja",
                     "a2a37622b263c675745fdfac04fccc35f2e187bd0dee26abdfa0c2bf03841adb"),
}


def download(project_file, dest):
    """The file from PyPI (not through pip: `pip download` of an sdist builds its metadata, minutes
    of CMake here), verified against the sha256 the simple index gives."""
    project, filename = project_file
    index = urllib.request.urlopen(urllib.request.Request(f"https://pypi.org/simple/{project}/",
                                                          headers={"Accept": "text/html"}), timeout=60).read().decode()
    match = re.search(r'href="([^"#]*/' + re.escape(filename) + r')#sha256=([0-9a-f]{64})"', index)
    if not match:
        raise OSError(f"{filename} is not in PyPI's index of {project}")
    url, sha = match.groups()
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, filename)
    with urllib.request.urlopen(url, timeout=600) as r, open(path, "wb") as f:
        f.write(r.read())
    with open(path, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != sha:
            raise OSError(f"{filename}: the download does not match PyPI's sha256")
    return path


def read_sdist(path, inner):
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if member.name.split("/", 1)[-1] == inner:
                return tar.extractfile(member).read()
    raise KeyError(inner)


def read_wheel(path, inner):
    with zipfile.ZipFile(path) as z:
        return z.read(inner)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            sdist = download(SDIST, os.path.join(tmp, "sdist"))
            wheel = download(WHEEL, os.path.join(tmp, "wheel"))
            mistral = download(MISTRAL_WHEEL, os.path.join(tmp, "mistral"))
        except (urllib.error.URLError, OSError) as e:
            print(f"fetch_reference_data: PyPI not reachable ({e}); the template parity test will skip")
            return 0
        for name, (source, inner, sha) in TEMPLATES.items():
            data = read_sdist(sdist, inner) if source == "sdist" else read_wheel(wheel, inner)
            got = hashlib.sha256(data).hexdigest()
            if got != sha:
                print(f"fetch_reference_data: {name} ({inner}) has sha256 {got}, not the pinned {sha}")
                return 1
            with open(os.path.join(out_dir, name + ".jinja"), "wb") as f:
                f.write(data)
        if read_wheel(wheel, PREFIX_AXOLOTL + "qwen_25.jinja") != read_sdist(sdist, TEMPLATES["qwen2.5"][1]):
            print("fetch_reference_data: axolotl's and llama.cpp's Qwen2.5 templates differ")
            return 1
        inner, name = MISTRAL_MODEL
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(read_wheel(mistral, inner))  # the wheel's digest (PyPI's) pins it
    print(f"fetch_reference_data: {len(TEMPLATES)} templates and a tokenizer model in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
