"""A model named on the Hugging Face Hub (MODEL_HF=owner/repo[:quant][@revision]). It picks which
GGUF of the repo, as llama-server's `-hf` picks it, and downloads it once into the shared cache.

The quant picks the GGUF whose file name holds it. The match is case-insensitive, as a word of the
name first (`Q4_K_M` is not `IQ4_K_M`). Without a quant, it picks the Q4_K_M file, then Q8_0, else
the repo's only GGUF. MODEL_HF_FILE names an exact file. A split model (`-00001-of-0000N.gguf`) is
downloaded whole and loaded from its first part. Projector and importance-matrix files are never
chosen. `@revision` pins a commit (or a branch or tag) instead of `main`. So every worker loads the
same file, whatever is pushed to the repo later.

Every file is checked against the sha256 the Hub gives for it. A GGUF is an LFS file, so that is
its etag, which names its blob in the cache. The check runs once after a download. It runs again
whenever the blob changed since, by its size and mtime, marked in HF_HOME/tokenspool-verified. A
file that does not match is deleted and the worker stops. So a corrupted or altered download is
never loaded.

The download is huggingface_hub's (the library made for this). It downloads into its cache at
HF_HOME, honouring HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE. Offline, the file is chosen among
those the cache holds. Workers on one host share the cache. Each file is locked by huggingface_hub,
so the second worker waits for the first and finds it there. Progress is logged as a line every few
seconds (bytes, total, rate). That suits JSON logs better than a bar. Anything that keeps the model
from loading is a `ModelUnavailable`. It may be no such repo, file or quant, or a gated repo
without a token. It may be no Hub and no cache. The worker logs its one line and exits non-zero.
The line names the repo and says what to do.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

# llama-server's order when no quant is named
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# projectors and importance matrices are GGUFs too
_NOT_MODELS = ("mmproj", "imatrix")


class ModelUnavailable(SystemExit):
    """The model cannot be had: one line naming the repo and what to do."""


@dataclass(frozen=True)
class HubModel:
    # owner/name
    repo: str
    quant: str | None = None
    # MODEL_HF_FILE
    file: str | None = None
    # a commit, branch or tag; None: main
    revision: str | None = None

    @classmethod
    def parse(cls, spec: str, file: str | None = None) -> HubModel:
        """`owner/repo[:quant][@revision]` (ValueError when it is not that)."""
        named, at, revision = spec.strip().partition("@")
        repo, _, quant = named.partition(":")
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo) or (at and not re.fullmatch(r"[\w./-]+", revision)):
            raise ValueError(f"expected owner/repo[:quant][@revision], not {spec!r}")
        return cls(repo, quant or None, file or None, revision or None)

    @property
    def name(self) -> str:
        """The name it is served as, unless MODEL_NAME says otherwise: the repo's."""
        return self.repo.split("/", 1)[1]


def _models(files: list[str]) -> dict[str, list[str]]:
    """The repo's models: each unsplit GGUF, or a split one's parts (first part -> parts)."""
    ggufs = [f for f in files if f.lower().endswith(".gguf") and not any(w in f.lower() for w in _NOT_MODELS)]
    out: dict[str, list[str]] = {}
    for f in sorted(ggufs):
        m = _SPLIT.match(f)
        if m is None:
            out[f] = [f]
            continue
        count = int(m["count"])
        parts = [f"{m['stem']}-{n:05d}-of-{m['count']}.gguf" for n in range(1, count + 1)]
        out.setdefault(parts[0], parts)
    return out


def _named(name: str, quant: str) -> bool:
    return re.search(rf"(^|[^A-Za-z0-9]){re.escape(quant)}([^A-Za-z0-9]|$)", name, re.IGNORECASE) is not None


def choose(model: HubModel, files: list[str]) -> list[str]:
    """The files to download. A split model's parts come in order, and the first is what is loaded."""
    models = _models(files)
    if model.file:
        m = _SPLIT.match(model.file)
        first = f"{m['stem']}-00001-of-{m['count']}.gguf" if m else model.file
        if first not in models or model.file not in models[first]:
            raise ModelUnavailable(
                f"{model.repo} has no GGUF file {model.file!r}: MODEL_HF_FILE must name one of "
                f"{sorted(models) or 'its files (it has no GGUF)'}"
            )
        return models[first]
    if not models:
        raise ModelUnavailable(f"{model.repo} holds no GGUF file: name a repo of GGUF models in MODEL_HF")
    if model.quant:
        picked = [f for f in models if _named(Path(f).name, model.quant)]
        picked = picked or [f for f in models if model.quant.lower() in Path(f).name.lower()]
        if len(picked) != 1:
            why = "no" if not picked else f"{len(picked)}"
            raise ModelUnavailable(
                f"{model.repo} has {why} GGUF named {model.quant!r} among {sorted(models)}: name another "
                "quant after the colon in MODEL_HF, or one file in MODEL_HF_FILE"
            )
        return models[picked[0]]
    for quant in DEFAULT_QUANTS:
        picked = [f for f in models if _named(Path(f).name, quant)]
        if picked:
            return models[picked[0]]
    if len(models) == 1:
        return next(iter(models.values()))
    raise ModelUnavailable(
        f"{model.repo} has {len(models)} GGUF models and none is Q4_K_M or Q8_0: name a quant "
        f"(MODEL_HF={model.repo}:<quant>) or a file (MODEL_HF_FILE) among {sorted(models)}"
    )


class LoggedProgress(tqdm):
    """huggingface_hub's progress as a log line every few seconds: bytes, total, rate."""

    EVERY_S = 5.0

    def __init__(self, *args, **kwargs) -> None:
        # tqdm displays from its __init__ already
        self._said = 0.0
        kwargs.update(disable=False, mininterval=self.EVERY_S, miniters=1, file=_Discard())
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        now = time.monotonic()
        done = bool(self.total) and self.n >= self.total
        if (now - self._said >= self.EVERY_S and not done) or (done and self._said >= 0):
            # the last line once
            self._said = -1.0 if done else now
            rate = self.n / max(self.format_dict["elapsed"], 1e-3)
            total = f"{self.total / 1e6:.1f}" if self.total else "?"
            name = (self.desc or "").rsplit("/", 1)[-1]
            log.info("downloading %s: %.1f of %s MB, %.1f MB/s", name, self.n / 1e6, total, rate / 1e6)
        return True


class _Discard:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def fetch(model: HubModel) -> Path:
    """The local path of the model's GGUF (its first part), downloading what the cache lacks."""
    import huggingface_hub as hf
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import logging as hf_logging

    # its own handler (added when that module loads) writes raw lines beside ours, a
    # mirror's password in HF_ENDPOINT included
    hf_logging.get_logger().handlers.clear()
    offline = constants.HF_HUB_OFFLINE
    where = "the cache (HF_HUB_OFFLINE=1)" if offline else f"{constants.ENDPOINT} nor the cache"
    missing = ModelUnavailable(
        f"{model.repo}: the model is in neither {where}: download it once with network access (or "
        "unset HF_HUB_OFFLINE), into the HF_HOME this worker uses"
    )
    rev = model.revision
    try:
        files = (
            _cached_files(model.repo, rev or "main")
            if offline
            else hf.list_repo_files(model.repo, revision=rev)
        )
        if offline and not files:
            raise missing
        parts = choose(model, files)
        log.info(
            "model %s%s: %s from %s",
            model.repo,
            f"@{rev}" if rev else "",
            parts[0] if len(parts) == 1 else parts,
            constants.ENDPOINT,
        )
        paths = [
            Path(
                hf.hf_hub_download(
                    model.repo, f, revision=rev, local_files_only=offline, tqdm_class=LoggedProgress
                )
            )
            for f in parts
        ]
    except GatedRepoError:
        raise ModelUnavailable(
            f"{model.repo} is gated: accept its terms on the Hub with your account, then set HF_TOKEN "
            "to a token of that account"
        ) from None
    except RepositoryNotFoundError:
        raise ModelUnavailable(
            f"{model.repo} does not exist on {constants.ENDPOINT} (or is private: set HF_TOKEN): "
            "check MODEL_HF"
        ) from None
    except RevisionNotFoundError:
        raise ModelUnavailable(
            f"{model.repo} has no revision {rev!r}: check what follows @ in MODEL_HF"
        ) from None
    except EntryNotFoundError as exc:
        raise ModelUnavailable(
            f"{model.repo}: {type(exc).__name__}: check MODEL_HF and MODEL_HF_FILE"
        ) from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        raise missing from None
    except OSError as exc:
        raise ModelUnavailable(f"{model.repo}: the download failed ({exc}): check HF_HOME's disk") from None
    # HfHubHTTPError, or the HTTP client's own: the Hub cannot be used
    except Exception as exc:
        raise ModelUnavailable(
            f"{model.repo}: {constants.ENDPOINT} could not be used ({type(exc).__name__}: {exc}): check "
            "HF_ENDPOINT and the network, or set HF_HUB_OFFLINE=1 to use the cache alone"
        ) from None
    for path in paths:
        verify(model.repo, path)
    return paths[0]


def verify(repo: str, path: Path) -> None:
    """Check the file against the sha256 its blob is named for. A Git LFS file's etag is that
    sha256, and huggingface_hub names the blob by it. The check is skipped if a mark says the file
    was checked and has not changed since. A file that does not match is deleted, and the worker
    stops. The next start downloads it again. A file without a sha256 is not checked. Such a file
    is small, and git keeps it itself."""
    from huggingface_hub import constants

    blob = path.resolve()
    expected = blob.name
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        return
    stat = blob.stat()
    mark = Path(constants.HF_HOME) / "tokenspool-verified" / expected
    seen = f"{stat.st_size} {stat.st_mtime_ns}"
    if mark.is_file() and mark.read_text() == seen:
        return
    digest = hashlib.sha256()
    with blob.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        blob.unlink()
        raise ModelUnavailable(
            f"{repo}: {path.name}'s sha256 is {digest.hexdigest()}, not the Hub's {expected}: the "
            "download was corrupted or altered and was deleted; start the worker again to download it"
        )
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(seen)


def _cached_files(repo: str, revision: str) -> list[str]:
    """The files of the repo's cached snapshot of `revision`. It is a commit, or a branch or tag the
    cache has a ref of. Offline, nothing else can be asked."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    ref = folder / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        return []
    return sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file() or p.is_symlink())
