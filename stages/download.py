"""download: put the DLRM-format dataset files in paths.raw, with a manifest of where they came from.

data.source = synthetic: generate them (seeded); = dlrm: check the user's files and copy them in.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from dreamshard.project.data import MANIFEST, SyntheticConfig, generate_synthetic, is_dataset_file, load_dlrm_file, save_dlrm_file
from dreamshard.project.domain import atomic_path, write_text
from dreamshard.project.params import ParamsError, build, section


def run(params: dict[str, Any]) -> None:
    out = Path(section(params, "paths.raw"))
    data = section(params, "data")
    source = data.get("source")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():  # a rerun must not keep files of an earlier configuration
        old.unlink()
    if source == "synthetic":
        cfg = build(SyntheticConfig, data.get("synthetic", {}), "data.synthetic")
        name = f"synthetic_t{cfg.num_tables + cfg.heavy_tables}_bs{cfg.batch_size}.pt.gz"
        save_dlrm_file(generate_synthetic(cfg), out / name)
        manifest = {"source": "synthetic", "files": [name], "config": data.get("synthetic", {})}
    elif source == "dlrm":
        files = dlrm_files(data.get("dlrm_paths"))
        for f in files:
            load_dlrm_file(f)  # fail on a malformed file before copying anything big
        for f in files:
            with atomic_path(out / f.name) as tmp:
                tmp.unlink()
                try:
                    os.link(f, tmp)  # same filesystem: no copy of multi-GB files
                except OSError:
                    shutil.copyfile(f, tmp)
        manifest = {"source": "dlrm", "files": [f.name for f in files], "origin": [str(f) for f in files]}
    else:
        raise ParamsError(f"params.yaml: data.source: expected 'synthetic' or 'dlrm', got {source!r}")
    write_text(json.dumps(manifest, indent=2) + "\n", out / MANIFEST)
    print(f"download: {len(manifest['files'])} {manifest['source']} file(s) in {out}")


def dlrm_files(paths: Any) -> list[Path]:
    """Files named in data.dlrm_paths; a folder stands for its .pt / .pt.gz files."""
    if not paths or not isinstance(paths, list):
        raise ParamsError("params.yaml: data.dlrm_paths: expected a list of dataset files or folders for source 'dlrm'")
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if is_dataset_file(f))
            if not found:
                raise ParamsError(f"params.yaml: data.dlrm_paths: {p} holds no .pt or .pt.gz files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ParamsError(f"params.yaml: data.dlrm_paths: {p} does not exist")
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise ParamsError("params.yaml: data.dlrm_paths: two files share a name")
    return files
