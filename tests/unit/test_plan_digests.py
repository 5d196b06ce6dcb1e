"""tools.plan_digests --compare: per sharder, how many plans of the same tasks differ between two runs."""
from __future__ import annotations

import json

from tools.plan_digests import main


def test_compare_counts_differing_plans_per_sharder_and_fails_when_any_differs(tmp_path, capsys):
    a = {"plans": {"validation/f/0000 torchrec_full": "aa", "validation/f/0001 torchrec_full": "bb",
                   "validation/f/0000 dreamshard_cut": "cc", "validation/f/0002 dreamshard_cut": "dd"}}
    b = {"plans": {"validation/f/0000 torchrec_full": "aa", "validation/f/0001 torchrec_full": "xx",
                   "validation/f/0000 dreamshard_cut": "cc"}}  # 0002 not planned in b: not compared
    for name, data in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    assert main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert lines == {"torchrec_full": "1 of   2 plans differ", "dreamshard_cut": "0 of   1 plans differ"}
    assert main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
