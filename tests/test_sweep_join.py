"""Joining a sweep's export with a published table cannot mislead: keys match by value,
the matched count is given, a join that matches nothing or finds a key twice is refused,
and the published columns keep their types through Parquet."""

import json

import pyarrow.parquet as pq
import pytest

from robustjax.sweep import export

ROWS = [{"arch_id": "nb201:42", "index": 42, "clean": 0.9}, {"arch_id": "nb201:7", "index": 7, "clean": 0.8},
        {"arch_id": "nb201:3", "index": 3, "clean": 0.7}]


def test_numbers_match_by_value_and_keep_their_types(tmp_path):
    published = tmp_path / "published.csv"
    published.write_text("index,test_accuracy,epochs,dataset\n42.0,93.76,200,cifar10\n7,91,12,cifar10\n")
    joined, matched = export.join(ROWS, published)
    assert matched == 2
    assert joined[0]["published_test_accuracy"] == 93.76 and joined[1]["published_test_accuracy"] == 91.0
    assert type(joined[1]["published_test_accuracy"]) is float and joined[0]["published_epochs"] == 200
    assert joined[0]["published_dataset"] == "cifar10" and "published_test_accuracy" not in joined[2]
    back = pq.read_table(export.write(joined, tmp_path / "r.parquet", "parquet")).to_pylist()
    assert back[0]["published_test_accuracy"] == 93.76 and back[1]["published_epochs"] == 12
    assert back[2]["published_test_accuracy"] is None and back[0]["index"] == 42
    lines = tmp_path / "published.jsonl"
    lines.write_text(json.dumps({"index": "7", "robust": 0.5}) + "\n")
    joined, matched = export.join(ROWS, lines)
    assert matched == 1 and joined[1]["published_robust"] == 0.5


def test_a_join_that_cannot_be_right_is_refused(tmp_path):
    miss = tmp_path / "miss.csv"
    miss.write_text("index,acc\n1000,1\n1001,2\n")
    with pytest.raises(ValueError, match=r"no network matched a row of .*miss.csv on 'index': the sweep's values "
                       r"look like \[42, 7, 3\], the file's like \[1000, 1001\]"):
        export.join(ROWS, miss)
    twice = tmp_path / "twice.csv"
    twice.write_text("index,acc\n42,1\n42.0,2\n")
    with pytest.raises(ValueError, match=r"two rows have index = 42.0; keep one row per network"):
        export.join(ROWS, twice)
    with pytest.raises(ValueError, match=r"has no 'arch' column to join on \(its columns: \['acc', 'index'\]\)"):
        export.join(ROWS, twice, on="arch")
    models = [{"arch_id": "digits_cnn", "clean": 0.99}]
    with pytest.raises(ValueError, match=r"the sweep's rows have no 'index' column"):
        export.join(models, miss)
