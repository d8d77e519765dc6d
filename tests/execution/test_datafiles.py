"""Data of one's own (`runtime.execution.datafiles`): each format read exactly, shards that join
into the global batch, streaming, errors naming file:line and column, a sync job on a file
equal to local training, and Criteo logs training `ctr_dnn`."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from runtime.config.scenario import ScenarioError, load_scenario, parse_scenario
from runtime.execution.data import epoch_permutation
from runtime.execution.datafiles import CRITEO_STRIDE, FileDataset
from runtime.services.cluster import train_locally
from runtime.services.job import Job, JobError
from runtime.services.node import load_for_role, resolve_role
from transpiler.models import build_model

import example_runs
from cluster_helpers import FAST_DRAIN, free_endpoints, run
from data_helpers import assert_feeds_equal, join

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_data.yaml"
N = 37  # records: batches of 4 x 2 trainers straddle the end of the file


def job_for(tmp_path: Path, data: str, model: str = "{name: linear}", extra: str = "") -> Job:
    """A job whose scenario file lies in `tmp_path`, so relative data paths start there."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(f"name: t\nseed: 3\nmodel: {model}\ndata: {data}\n{extra}")
    return Job.from_scenario(load_scenario(scenario))


def regression_arrays(rows: int = N) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return (rng.normal(size=(rows, 13)).astype(np.float32),
            rng.normal(size=(rows, 1)).astype(np.float32))


def write_csv(path: Path, x: np.ndarray, y: np.ndarray, header: bool = True) -> None:
    lines = [",".join([f"x{i}" for i in range(x.shape[1])] + ["target"])] if header else []
    lines += [",".join(repr(float(v)) for v in row) + f",{float(t[0])!r}" for row, t in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")


def expected_rows(step: int, batch: int, trainer: int, trainers: int, count: int = N) -> np.ndarray:
    start = (step * trainers + trainer) * batch
    return np.arange(start, start + batch) % count


# -- each format, read exactly ------------------------------------------------------------------

@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_rows_are_the_arrays_rows(tmp_path: Path, save) -> None:
    x, y = regression_arrays()
    save(tmp_path / "d.npz", x=x, y=y[:, 0].astype(np.float64))  # y: 1-D, float64 -> float32
    dataset = job_for(tmp_path, "{name: npz, path: d.npz, batch_size: 4}").dataset
    for step in range(12):  # three passes over the file
        for t in range(2):
            feed = dataset.shard(t, 2).batch(step, 4)
            rows = expected_rows(step, 4, t, 2)
            np.testing.assert_array_equal(feed["x"], x[rows])
            assert feed["y"].dtype == np.float32 and feed["y"].shape == (4, 1)
            np.testing.assert_array_equal(feed["y"], y[rows])


def test_csv_columns_map_to_feeds_by_name_pattern_and_list(tmp_path: Path) -> None:
    x, y = regression_arrays()
    write_csv(tmp_path / "d.csv", x, y)
    reference = np.loadtxt(tmp_path / "d.csv", delimiter=",", skiprows=1, dtype=np.float32)
    np.testing.assert_array_equal(reference, np.hstack([x, y]))
    listed = "[" + ", ".join(f"x{i}" for i in range(13)) + "]"
    for feeds in ("{x: 'x*', y: target}", f"{{x: {listed}, y: [target]}}"):
        dataset = job_for(tmp_path, f"{{name: csv, path: d.csv, batch_size: 5, feeds: {feeds}}}").dataset
        for step in range(9):
            feed = dataset.batch(step, 5)
            rows = expected_rows(step, 5, 0, 1)
            np.testing.assert_array_equal(feed["x"], reference[rows, :13])
            np.testing.assert_array_equal(feed["y"], reference[rows, 13:])


def test_csv_without_header_and_with_another_delimiter(tmp_path: Path) -> None:
    x, y = regression_arrays()
    write_csv(tmp_path / "d.csv", x, y, header=False)
    (tmp_path / "d.tsv").write_text((tmp_path / "d.csv").read_text().replace(",", ";"))
    data = ("{name: csv, path: d.tsv, header: false, delimiter: ';', batch_size: 8, "
            "feeds: {x: 'c[0-9]', y: c13}}")
    with pytest.raises(JobError, match="feed 'x' is float32\\[13\\], but its column"):
        job_for(tmp_path, data).dataset  # c[0-9] is 10 columns: c0..c9
    dataset = job_for(tmp_path, data.replace("'c[0-9]'", "['c?', 'c1[0-2]']")).dataset
    rows = expected_rows(0, 8, 0, 1)
    feed = dataset.batch(0, 8)
    np.testing.assert_array_equal(feed["x"], x[rows])
    np.testing.assert_array_equal(feed["y"], y[rows])


LIBSVM = """\
1 1:0.5 3:-2 64:1e-3
0 2:1.25

1 5:3 # a comment
0 1:1 64:7
"""


def test_libsvm_densifies_features_and_reads_labels(tmp_path: Path) -> None:
    (tmp_path / "d.svm").write_text(LIBSVM)
    model = "{name: mlp, sizes: [64, 8, 2]}"
    dataset = job_for(tmp_path, "{name: libsvm, path: d.svm, batch_size: 6}", model).dataset
    expected = np.zeros((4, 64), np.float32)
    expected[0, [0, 2, 63]] = [0.5, -2, np.float32(1e-3)]
    expected[1, 1] = 1.25
    expected[2, 4] = 3
    expected[3, [0, 63]] = [1, 7]
    feed = dataset.batch(0, 6)
    np.testing.assert_array_equal(feed["x"], expected[[0, 1, 2, 3, 0, 1]])
    np.testing.assert_array_equal(feed["label"], np.array([[1], [0], [1], [0], [1], [0]]))
    sklearn = pytest.importorskip("sklearn.datasets")
    X, labels = sklearn.load_svmlight_file(str(tmp_path / "d.svm"), n_features=64,
                                           dtype=np.float32, zero_based=False)
    np.testing.assert_array_equal(X.toarray(), expected)
    np.testing.assert_array_equal(labels, [1, 0, 1, 0])


def test_libsvm_indices_fill_a_lod_id_feed(tmp_path: Path) -> None:
    (tmp_path / "d.svm").write_text(LIBSVM)
    model = "{name: ctr_dnn, slots: [words], vocab: 100, embed_dim: 4, hidden: [4]}"
    dataset = job_for(tmp_path, "{name: libsvm, path: d.svm, batch_size: 3, zero_based: true}",
                      model).dataset
    values, lod = dataset.batch(1, 3)["words"]  # records 3, 0, 1
    assert lod == [[0, 2, 5, 6]]
    np.testing.assert_array_equal(values[:, 0], [1, 64, 1, 3, 64, 2])


def criteo_line(rng: np.random.Generator, label: int) -> str:
    ints = [str(int(v)) if rng.random() > 0.2 else "" for v in rng.integers(-2, 500, 13)]
    cats = [f"{int(v):08x}" if rng.random() > 0.1 else "" for v in rng.integers(0, 2**32, 26)]
    return "\t".join([str(label)] + ints + cats)


def criteo_reference(line: str, vocab: int, log_ints: bool) -> tuple[int, np.ndarray, np.ndarray]:
    fields = line.split("\t")
    ints = np.array([int(f) if f else 0 for f in fields[1:14]], dtype=np.float64)
    dense = np.log1p(np.maximum(ints, 0)) if log_ints else ints
    ids = np.array([0 if not f else 1 + (int(f, 16) + j * CRITEO_STRIDE) % (vocab - 1)
                    for j, f in enumerate(fields[14:])])
    return int(fields[0]), dense.astype(np.float32), ids


@pytest.mark.parametrize("log_ints", [True, False])
def test_criteo_fields_become_dense_features_ids_and_label(tmp_path: Path, log_ints: bool) -> None:
    rng = np.random.default_rng(0)
    lines = [criteo_line(rng, k % 2) for k in range(10)]
    (tmp_path / "day_0").write_text("\n".join(lines) + "\n")
    model = "{name: ctr_dnn, dense: 13, vocab: 1000, embed_dim: 4, hidden: [8]}"
    job = job_for(tmp_path, f"{{name: criteo, path: day_0, batch_size: 4, log_ints: {log_ints}}}",
                  model)
    assert job.model.feeds == ["dense", "title_ids", "brand_ids", "label"]
    feed = job.dataset.batch(1, 4)  # records 4..7
    refs = [criteo_reference(lines[r], 1000, log_ints) for r in range(4, 8)]
    np.testing.assert_array_equal(feed["label"], [[r[0]] for r in refs])
    np.testing.assert_array_equal(feed["dense"], np.stack([r[1] for r in refs]))
    for slot, cols in (("title_ids", slice(0, 13)), ("brand_ids", slice(13, 26))):
        values, lod = feed[slot]
        assert values.dtype == np.int64 and lod == [[0, 13, 26, 39, 52]]
        np.testing.assert_array_equal(values[:, 0], np.concatenate([r[2][cols] for r in refs]))


def test_criteo_slots_may_name_their_columns(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    lines = [criteo_line(rng, 1) for _ in range(3)]
    (tmp_path / "day_0").write_text("\n".join(lines) + "\n")
    model = "{name: ctr_dnn, slots: [a, b], vocab: 50, embed_dim: 4, hidden: [8]}"
    feed = job_for(tmp_path, "{name: criteo, path: day_0, batch_size: 3, feeds: {a: C3, b: "
                   "[C1, C26]}}", model).dataset.batch(0, 3)
    refs = [criteo_reference(line, 50, True)[2] for line in lines]
    np.testing.assert_array_equal(feed["a"][0][:, 0], [r[2] for r in refs])
    np.testing.assert_array_equal(feed["b"][0][:, 0], np.concatenate([r[[0, 25]] for r in refs]))
    assert feed["b"][1] == [[0, 2, 4, 6]]


# -- order: shards, epochs, shuffle ---------------------------------------------------------------

def test_shards_join_into_the_global_batch_and_shuffle_is_seeded(tmp_path: Path) -> None:
    x, y = regression_arrays()
    np.savez(tmp_path / "d.npz", x=x, y=y)
    write_csv(tmp_path / "d.csv", x, y)
    for data in ("{name: npz, path: d.npz, batch_size: 3, shuffle: true}",
                 "{name: csv, path: d.csv, batch_size: 3, shuffle: true, "
                 "feeds: {x: 'x*', y: target}}"):
        dataset = job_for(tmp_path, data).dataset
        for step in range(14):
            parts = [dataset.shard(t, 3).batch(step, 3) for t in range(3)]
            whole = dataset.batch(step, 9)
            assert_feeds_equal(join(parts), whole)
            positions = np.arange(step * 9, step * 9 + 9)
            rows = [epoch_permutation(3, p // N, N)[p % N] for p in positions]
            np.testing.assert_array_equal(whole["x"], x[rows])


def test_size_reads_only_the_first_records(tmp_path: Path) -> None:
    x, y = regression_arrays()
    write_csv(tmp_path / "d.csv", x, y)
    dataset = job_for(tmp_path, "{name: csv, path: d.csv, batch_size: 4, size: 10, "
                      "feeds: {x: 'x*', y: target}}").dataset
    np.testing.assert_array_equal(dataset.batch(2, 4)["x"], x[[8, 9, 0, 1]])


# -- streaming ------------------------------------------------------------------------------------

def test_text_is_read_line_by_line_and_any_access_order_gives_the_same_batches(
        tmp_path: Path) -> None:
    """A 6 MB csv read a batch at a time holds a few kB; reading the steps in any order (each
    from a fresh reader, or backwards) gives the batches of reading them in turn."""
    rows = 40_000
    x, y = regression_arrays(rows)
    write_csv(tmp_path / "big.csv", x, y)
    assert (tmp_path / "big.csv").stat().st_size > 6e6
    job = job_for(tmp_path, "{name: csv, path: big.csv, batch_size: 64, "
                  "feeds: {x: 'x*', y: target}}")
    dataset = job.dataset
    shard = dataset.shard(1, 2)
    tracemalloc.start()
    in_turn = [shard.batch(step, 64) for step in (0, 1, 2, 150, 311, 312, 313)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000, peak
    backwards = [shard.batch(step, 64) for step in (313, 312, 311, 150, 2, 1, 0)][::-1]
    fresh = [dataset.shard(1, 2).batch(step, 64) for step in (0, 1, 2, 150, 311, 312, 313)]
    for step, a, b, c in zip((0, 1, 2, 150, 311, 312, 313), in_turn, backwards, fresh):
        assert_feeds_equal(a, b)
        assert_feeds_equal(a, c)
        np.testing.assert_array_equal(a["x"], x[expected_rows(step, 64, 1, 2, rows)])


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_arrays_are_mapped_or_streamed_not_loaded(tmp_path: Path, save) -> None:
    rows = 200_000
    x = np.arange(rows * 13, dtype=np.float32).reshape(rows, 13)
    save(tmp_path / "big.npz", x=x, y=np.arange(rows, dtype=np.float32))
    dataset = job_for(tmp_path, "{name: npz, path: big.npz, batch_size: 32}").dataset
    tracemalloc.start()
    feed = dataset.shard(1, 2).batch(3000, 32)  # rows 192032..192063, near the end
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2_000_000, peak  # the array is 10 MB
    np.testing.assert_array_equal(feed["x"], x[expected_rows(3000, 32, 1, 2, rows)])


# -- errors ---------------------------------------------------------------------------------------

def bad_csv(tmp_path: Path, line: int, column: int, text: str) -> None:
    x, y = regression_arrays(20)
    write_csv(tmp_path / "data.csv", x, y)
    lines = (tmp_path / "data.csv").read_text().splitlines()
    fields = lines[line - 1].split(",")
    fields[column] = text
    lines[line - 1] = ",".join(fields)
    (tmp_path / "data.csv").write_text("\n".join(lines) + "\n")


def test_a_bad_value_names_file_line_and_column(tmp_path: Path) -> None:
    bad_csv(tmp_path, 17, 3, "abc")
    dataset = job_for(tmp_path, "{name: csv, path: data.csv, batch_size: 4, "
                      "feeds: {x: 'x*', y: target}}").dataset
    dataset.batch(2, 4)  # records 8..11 are lines 10..13
    with pytest.raises(ValueError, match=r"data\.csv:17: column 'x3': could not convert 'abc' "
                                         r"to float32"):
        dataset.batch(3, 4)  # records 12..15 are lines 14..17


def test_a_bad_first_record_fails_before_training(tmp_path: Path) -> None:
    bad_csv(tmp_path, 2, 13, "")
    with pytest.raises(JobError, match=r"scenario.yaml: data: .*data\.csv:2: column 'target': "
                                       r"could not convert '' to float32"):
        job_for(tmp_path, "{name: csv, path: data.csv, feeds: {x: 'x*', y: target}}").check()


@pytest.mark.parametrize("text,line,match", [
    ("1 1:0.5\n0 2:x\n", 2, r"column 'features\[2\]': could not convert 'x' to float32"),
    ("1 1:0.5\n0 2-1\n", 2, r"column 'features': item 1 '2-1' is not index:value"),
    ("1 1:0.5\n0 65:1\n", 2, r"column 'features': index 65 is outside feed 'x' of width 64"),
    ("1 1:0.5\nyes 2:1\n", 2, r"column 'label': could not convert 'yes' to int64"),
])
def test_libsvm_errors_name_line_and_column(tmp_path: Path, text: str, line: int,
                                            match: str) -> None:
    (tmp_path / "d.svm").write_text(text)
    dataset = job_for(tmp_path, "{name: libsvm, path: d.svm, batch_size: 2}",
                      "{name: mlp, sizes: [64, 4, 2]}").dataset
    with pytest.raises(ValueError, match=rf"d\.svm:{line}: {match}"):
        dataset.batch(0, 2)


def test_criteo_errors_name_line_and_column(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    good = criteo_line(rng, 1)
    fields = good.split("\t")
    lines = [good, "\t".join(fields[:-1]), "\t".join(fields[:20] + ["xyz"] + fields[21:]),
             "\t".join(fields[:5] + ["1.5"] + fields[6:])]
    (tmp_path / "day").write_text("\n".join(lines) + "\n")
    dataset = job_for(tmp_path, "{name: criteo, path: day, batch_size: 1}",
                      "{name: ctr_dnn, dense: 13, vocab: 100, embed_dim: 4, hidden: [4]}").dataset
    for step, match in ((1, r"day:2: 39 tab-separated fields; a Criteo record has 40"),
                        (2, r"day:3: column 'C7': 'xyz' is not a hexadecimal hash"),
                        (3, r"day:4: column 'I5': could not convert '1.5' to int64")):
        with pytest.raises(ValueError, match=match):
            dataset.batch(step, 1)


@pytest.mark.parametrize("data,model,match", [
    ("{name: npz, path: d.npz}", "{name: mlp, sizes: [13, 4, 2]}",
     r"d\.npz: feeds.label: no column 'label'; the file has columns 'x', 'y', 'z'"),
    ("{name: npz, path: d.npz, feeds: {label: z}}", "{name: mlp, sizes: [13, 4, 2]}",
     r"d\.npz: array 'z' is float32, which feed 'label' \(int64\[1\]\) cannot take"),
    ("{name: npz, path: d.npz, feeds: {x: [x, y]}}", "{name: linear}",
     r"feed 'x' is float32\[13\], but its column\(s\) 'x', 'y' hold 14 value\(s\) a record"),
    ("{name: npz, path: d.npz, feeds: {w: x}}", "{name: linear}",
     r"d\.npz: feeds.w: model 'linear' has no such feed; its feeds are \['x', 'y'\]"),
    ("{name: npz, path: missing.npz}", "{name: linear}",
     r"missing\.npz: no such file \(a relative data.path starts from the scenario file's"),
    ("{name: npz, path: dz.npz, shuffle: true}", "{name: linear}",
     r"dz\.npz: shuffle reads records in random order, which a compressed array"),
])
def test_a_feed_that_does_not_fit_is_named_before_training(tmp_path: Path, data: str,
                                                           model: str, match: str) -> None:
    x, y = regression_arrays()
    np.savez(tmp_path / "d.npz", x=x, y=y, z=y)
    np.savez_compressed(tmp_path / "dz.npz", x=x, y=y)
    with pytest.raises(JobError, match=match):
        job_for(tmp_path, data, model).check()


@pytest.mark.parametrize("data,match", [
    ("{name: csv}", r"data: name csv: reading a file needs its path"),
    ("{name: digits, path: a.csv}", r"data: path is for files \(name: npz \| csv"),
    ("{shuffle: false}", r"shuffle: false is for files; built-in data sets are always"),
    ("{name: npz, path: a.npz, header: false}", r"data: header is for data.name csv, not npz"),
    ("{name: csv, path: a.csv, log_ints: false}", r"log_ints is for data.name criteo, not csv"),
])
def test_the_schema_keeps_file_options_to_files(data: str, match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        parse_scenario(f"name: t\nmodel: {{name: linear}}\ndata: {data}\n")


def test_a_pserver_needs_no_data_file_a_trainer_does(tmp_path: Path) -> None:
    """Across hosts, the data file must be on each trainer's host only."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("name: t\nmodel: {name: linear}\ndata: {name: csv, path: elsewhere.csv}\n"
                        "cluster: {pservers: 1, trainers: 2}\n")
    endpoints = "127.0.0.1:7164"
    load_for_role(scenario, [], resolve_role("pserver", 0, endpoints, {}))
    with pytest.raises(JobError, match="elsewhere.csv: no such file"):
        load_for_role(scenario, [], resolve_role("trainer", 1, endpoints, {}))


# -- training -------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["npz", "csv"])
def test_a_2x2_sync_job_on_a_file_equals_local_training(tmp_path: Path, fmt: str) -> None:
    x, y = regression_arrays(50)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    write_csv(tmp_path / "d.csv", x, y)
    data = ("{name: npz, path: d.npz, batch_size: 8, shuffle: true}" if fmt == "npz" else
            "{name: csv, path: d.csv, batch_size: 8, feeds: {x: 'x*', y: target}}")
    eps = free_endpoints(2)
    job = job_for(tmp_path, data, "{name: linear, optimizer: {type: sgd, learning_rate: 0.05}}",
                  f"cluster: {{pservers: 2, trainers: 2, endpoints: {{pservers: {eps}}}}}\n"
                  f"train: {{steps: 12, deadline: 60s, retry_after: {FAST_DRAIN}}}\n")
    result = run(job)
    losses, local = train_locally(job)
    for name, value in local.items():
        np.testing.assert_allclose(result.params[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    assert all(len(r.losses) == 12 for r in result.trainers)
    assert losses[-1] < losses[0]


def test_a_criteo_sample_trains_ctr_dnn(tmp_path: Path) -> None:
    """Clicks that depend on one categorical column and one integer: the loss falls."""
    rng = np.random.default_rng(5)
    hashes = rng.integers(0, 2**32, 8)
    lines = []
    for _ in range(400):
        line = criteo_line(rng, 0).split("\t")
        k = int(rng.integers(0, 8))
        line[14] = f"{int(hashes[k]):08x}"  # C1
        line[1] = str(int(rng.integers(0, 100)))  # I1
        line[0] = str(int(k < 4 or int(line[1]) > 90))
        lines.append("\t".join(line))
    (tmp_path / "sample.txt").write_text("\n".join(lines) + "\n")
    job = job_for(tmp_path, "{name: criteo, path: sample.txt, batch_size: 40}",
                  "{name: ctr_dnn, dense: 13, vocab: 1000, embed_dim: 8, hidden: [16], "
                  "optimizer: {type: adam, learning_rate: 0.02}}",
                  "train: {steps: 60}\n")
    losses, _ = train_locally(job)
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert math.isfinite(last) and last < 0.6 * first, (first, last)


def test_ctr_dnn_without_dense_features_is_the_program_it_was() -> None:
    plain, with_zero = build_model("ctr_dnn"), build_model("ctr_dnn", dense=0)
    assert str(plain.main) == str(with_zero.main) and plain.feeds == with_zero.feeds


def test_phantom_batch_has_the_shapes_of_a_real_one(tmp_path: Path) -> None:
    (tmp_path / "d.svm").write_text(LIBSVM)
    dataset = job_for(tmp_path, "{name: libsvm, path: d.svm, batch_size: 3}",
                      "{name: mlp, sizes: [64, 8, 2]}").dataset
    phantoms = dataset.phantom_batch(3)
    assert phantoms["x"].shape == (3, 64) and phantoms["label"].dtype == np.int64
    assert isinstance(dataset, FileDataset)


def test_the_example_trains_in_sim_run_from_another_folder(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    metrics = example_runs.sim_run(EXAMPLE, tmp_path)
    assert metrics.job.success and [e.passed for e in metrics.expectations] == [True] * 3


@pytest.mark.timeout(120)
def test_the_example_trains_under_runtime_up(tmp_path: Path) -> None:
    """Every trainer process opens the csv beside the scenario and reads its own shard."""
    metrics = example_runs.runtime_up(EXAMPLE, tmp_path)
    assert metrics.job.success and metrics.job.steps == 12
    assert [e.name for e in metrics.expectations if e.passed] == ["params_equal_to",
                                                                  "no_lost_updates"]
