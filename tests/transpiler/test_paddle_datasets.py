"""``paddle.dataset``'s readers of Paddle's own data sets (`runtime.paddle.dataset`): each reads
tiny files written here in the original formats, in Paddle's cache layout under a
``DATA_HOME`` of the test's own, and yields Paddle's samples exactly; a missing file is one
error naming it, its URL and where it goes. Nothing here touches the network."""

from __future__ import annotations

import gzip
import io
import os
import random
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import runtime.paddle as paddle
from runtime.paddle.dataset import common, ctr, flowers, imdb, imikolov, mnist, movielens
from runtime.paddle.dataset import uci_housing


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``DATA_HOME`` that the readers read when made."""
    monkeypatch.setattr(common, "DATA_HOME", str(tmp_path))
    return tmp_path


def put(home: Path, module: str, name: str, data: bytes) -> Path:
    path = home / module / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def tgz(members: dict[str, bytes]) -> bytes:
    """A gzipped tar of the members, in the order given."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# -- missing files, the cache's layout --------------------------------------------------------

def test_a_missing_file_is_one_error_naming_each_file_its_url_and_place(home: Path) -> None:
    with pytest.raises(common.DatasetFileMissing) as err:
        paddle.dataset.mnist.train()
    message = str(err.value)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        url = f"https://dataset.bj.bcebos.com/mnist/{name}"
        assert f"{home / 'mnist' / name} (from {url}, md5 " in message
    assert "md5 f68b3c2dcbeaaa9fbdd348bbdeb94873" in message and "never downloads" in message
    assert "t10k" not in message and isinstance(err.value, FileNotFoundError)
    assert [path.name for path, _ in err.value.missing] == ["train-images-idx3-ubyte.gz",
                                                             "train-labels-idx1-ubyte.gz"]


@pytest.mark.parametrize(("read", "path"), [
    (lambda: paddle.dataset.mnist.fetch(), "mnist/t10k-labels-idx1-ubyte.gz"),
    (lambda: paddle.dataset.uci_housing.train(), "uci_housing/housing.data"),
    (lambda: paddle.dataset.imikolov.build_dict(), "imikolov/simple-examples.tgz"),
    (lambda: paddle.dataset.imdb.word_dict(), "imdb/aclImdb_v1.tar.gz"),
    (lambda: paddle.dataset.movielens.train(), "movielens/ml-1m.zip"),
    (lambda: paddle.dataset.flowers.test(), "flowers/setid.mat"),
    (lambda: paddle.dataset.ctr.train(), "avazu_ctr_data/avazu_ctr_data.tgz")])
def test_each_reader_names_the_file_it_lacks_when_made(home: Path, read: Any, path: str) -> None:
    with pytest.raises(common.DatasetFileMissing, match=str(home / path)):
        read()


def test_data_home_is_paddles_cache_under_home(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    code = "import runtime.paddle.dataset.common as c; print(c.DATA_HOME)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2]).stdout
    assert out == f"{tmp_path}/.cache/paddle/dataset\n"


def test_download_only_finds_and_md5file_hashes(home: Path) -> None:
    url = "http://paddle-ctr-data.bj.bcebos.com/avazu_ctr_data.tgz"
    with pytest.raises(FileNotFoundError, match="avazu_ctr_data/avazu_ctr_data.tgz"):
        common.download(url, "avazu_ctr_data", "c11df99fbd14e53cd4bfa6567344b26e")
    path = put(home, "avazu_ctr_data", "avazu_ctr_data.tgz", b"abc")
    assert common.download(url, "avazu_ctr_data", "not checked") == str(path)
    saved = put(home, "x", "saved.bin", b"")
    assert common.download(url, "x", "m", save_name="saved.bin") == str(saved)
    assert common.md5file(path) == "900150983cd24fb0d6963f7d28e17f72"


# -- mnist ------------------------------------------------------------------------------------

def idx(magic: int, dims: tuple[int, ...], data: bytes) -> bytes:
    return gzip.compress(struct.pack(f">{len(dims) + 1}I", magic, *dims) + data)


def test_mnist_scales_each_image_to_minus_one_one_and_keeps_the_labels(home: Path) -> None:
    pixels = np.zeros((3, 28, 28), np.uint8)
    pixels[0] = 255
    pixels[1, 0, :4] = [0, 51, 102, 255]
    pixels[2] = np.arange(784).reshape(28, 28) % 256
    put(home, "mnist", "t10k-images-idx3-ubyte.gz", idx(2051, (3, 28, 28), pixels.tobytes()))
    put(home, "mnist", "t10k-labels-idx1-ubyte.gz", idx(2049, (3,), bytes([7, 0, 9])))
    samples = list(paddle.dataset.mnist.test()())
    assert [label for _, label in samples] == [7, 0, 9]
    assert all(type(label) is int for _, label in samples)
    images = [image for image, _ in samples]
    assert all(im.dtype == np.float32 and im.shape == (784,) for im in images)
    assert images[0].tolist() == [1.0] * 784
    assert images[1][[0, 3]].tolist() == [-1.0, 1.0] and images[1][4:].tolist() == [-1.0] * 780
    assert images[1][1] == np.float32(-0.6) and images[1][2] == np.float32(-0.19999999)

    def scaled(v: np.ndarray) -> np.ndarray:  # in float32 throughout, as Paddle computes
        return v.astype(np.float32) / np.float32(255) * np.float32(2) - np.float32(1)
    assert images[2].tolist() == scaled(np.arange(784) % 256).tolist()


def test_mnist_refuses_a_file_that_is_not_idx(home: Path) -> None:
    put(home, "mnist", "train-images-idx3-ubyte.gz", idx(2049, (1, 28, 28), bytes(784)))
    put(home, "mnist", "train-labels-idx1-ubyte.gz", idx(2049, (1,), b"\x01"))
    with pytest.raises(ValueError, match="magic number 2049, not 2051"):
        list(mnist.train()())


# -- uci_housing ------------------------------------------------------------------------------

def test_uci_housing_normalizes_features_and_splits_eight_to_two(home: Path) -> None:
    rows = [[i * (j + 1) for j in range(13)] + [10 * (i + 1)] for i in range(5)]
    text = "\n".join("  ".join(str(v) for v in row) for row in rows)  # any whitespace
    put(home, "uci_housing", "housing.data", (" " + text + "\n").encode())
    train = list(paddle.dataset.uci_housing.train()())
    test = list(paddle.dataset.uci_housing.test()())
    assert len(train) == 4 and len(test) == 1
    # each column is i * (j + 1) for rows i = 0..4: mean 2 (j + 1), range 4 (j + 1)
    for i, (features, price) in enumerate(train + test):
        assert features.dtype == price.dtype == np.float64
        assert features.tolist() == [(i - 2) / 4] * 13 and price.tolist() == [10.0 * (i + 1)]
    assert uci_housing.predict_reader()[0].tolist() == [0.5] * 13


# -- imikolov ---------------------------------------------------------------------------------

@pytest.fixture
def ptb(home: Path) -> None:
    put(home, "imikolov", "simple-examples.tgz", tgz({
        "./simple-examples/data/ptb.train.txt": b" a b a a \n b c\n",
        "./simple-examples/data/ptb.valid.txt": b"a\n",
        "./simple-examples/data/ptb.test.txt": b"z z z\n"}))


def test_imikolov_counts_both_files_and_orders_by_frequency(ptb: None) -> None:
    # a: 4, <s> and <e>: 3 (one per line), b: 2, c: 1
    assert paddle.dataset.imikolov.build_dict(min_word_freq=1) == \
        {b"a": 0, "<e>": 1, "<s>": 2, b"b": 3, "<unk>": 4}
    assert imikolov.build_dict() == {"<unk>": 0}  # none seen more than 50 times
    assert imikolov.build_dict(min_word_freq=0) == \
        {b"a": 0, "<e>": 1, "<s>": 2, b"b": 3, b"c": 4, "<unk>": 5}


def test_imikolov_yields_ngrams_and_sequences_of_ids(ptb: None) -> None:
    word_idx = imikolov.build_dict(min_word_freq=1)  # c is <unk>: 4
    assert list(imikolov.train(word_idx, 3)()) == [
        (2, 0, 3), (0, 3, 0), (3, 0, 0), (0, 0, 1), (2, 3, 4), (3, 4, 1)]
    assert list(imikolov.train(word_idx, 5)()) == [(2, 0, 3, 0, 0), (0, 3, 0, 0, 1)]
    assert list(imikolov.test(word_idx, 2)()) == [(2, 0), (0, 1)]
    seq = imikolov.DataType.SEQ
    assert list(imikolov.train(word_idx, 0, seq)()) == [([2, 0, 3, 0, 0], [0, 3, 0, 0, 1]),
                                                         ([2, 3, 4], [3, 4, 1])]
    assert list(imikolov.train(word_idx, 3, seq)()) == [([2, 3, 4], [3, 4, 1])]


def test_imikolov_finds_the_name_paddle_2_saves(home: Path) -> None:
    put(home, "imikolov", "imikolov%2Fsimple-examples.tgz", tgz({
        "simple-examples/data/ptb.train.txt": b"x\n", "simple-examples/data/ptb.valid.txt": b""}))
    assert imikolov.build_dict(0) == {"<e>": 0, "<s>": 1, b"x": 2, "<unk>": 3}


# -- imdb -------------------------------------------------------------------------------------

@pytest.fixture
def reviews(home: Path) -> None:
    put(home, "imdb", "aclImdb_v1.tar.gz", tgz({
        "aclImdb/README": b"not a review",
        "aclImdb/train/pos/0_9.txt": b"Great film, GREAT fun!\n",
        "aclImdb/train/neg/1_2.txt": b"Dull. Dull film...\r\n",
        "aclImdb/train/pos/2_8.txt": b"Fun <br /> great",
        "aclImdb/test/neg/0_1.txt": b"dull",
        "aclImdb/train/unsup/3_0.txt": b"great great great"}))


def test_imdb_tokenizes_as_paddle_and_counts_every_split(reviews: None) -> None:
    # dull 3, great 3 (equal counts: byte order), film 2, fun 2, br 1 (the tag's punctuation
    # removed); the unsup review is not counted
    every = imdb.re.compile(r"aclImdb/((train)|(test))/((pos)|(neg))/.*\.txt$")
    assert imdb.build_dict(every, 1) == {b"dull": 0, b"great": 1, b"film": 2, b"fun": 3,
                                         "<unk>": 4}
    assert paddle.dataset.imdb.word_dict() == {"<unk>": 0}  # none seen more than 150 times


def test_imdb_yields_positive_reviews_then_negative_ones(reviews: None) -> None:
    word_idx: dict[bytes | str, int] = {b"great": 0, b"dull": 1, b"film": 2, "<unk>": 3}
    assert list(imdb.train(word_idx)()) == [([0, 2, 0, 3], 0), ([3, 3, 0], 0), ([1, 1, 2], 1)]
    assert list(imdb.test(word_idx)()) == [([1], 1)]


def test_imdb_word_dict_cuts_at_more_than_150(home: Path) -> None:
    put(home, "imdb", "aclImdb_v1.tar.gz", tgz({
        "aclImdb/test/pos/0_7.txt": b"often " * 151 + b"rare " * 150}))
    assert imdb.word_dict() == {b"often": 0, "<unk>": 1}


# -- movielens --------------------------------------------------------------------------------

@pytest.fixture
def ratings(home: Path) -> None:
    movies = ("1::Toy Story (1995)::Animation|Children's|Comedy\n"
              "2::Café Society Blues (1999)::Drama|Comedy\n")
    users = "1::F::1::10::48067\n2::M::56::16::70072\n"
    lines = ["1::1::5::978300760", "1::2::3::978302109", "2::1::4::978301968",
             "2::2::1::978300275", "1::1::2::978824291", "2::2::5::978302268"]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as package:
        package.writestr("ml-1m/movies.dat", movies.encode("latin-1"))
        package.writestr("ml-1m/users.dat", users.encode("latin-1"))
        package.writestr("ml-1m/ratings.dat", ("\n".join(lines) + "\n").encode("latin-1"))
    put(home, "movielens", "ml-1m.zip", out.getvalue())


def test_movielens_yields_paddles_sample_lists(ratings: None) -> None:
    # categories sorted: Animation 0, Children's 1, Comedy 2, Drama 3; title words sorted:
    # blues 0, café 1, society 2, story 3, toy 4
    toy = [1, [0, 1, 2], [4, 3]]
    cafe = [2, [3, 2], [1, 2, 0]]
    female, male = [1, 1, 0, 10], [2, 0, 6, 16]
    # RandomState(0)'s draws: .549 .715 .603 .545 .424 .646: only the fifth is below 0.5
    assert list(movielens.train(test_ratio=0.5)()) == [
        female + toy + [[5.0]], female + cafe + [[1.0]], male + toy + [[3.0]],
        male + cafe + [[-3.0]], male + cafe + [[5.0]]]
    assert list(movielens.test(test_ratio=0.5)()) == [female + toy + [[-1.0]]]
    assert len(list(paddle.dataset.movielens.train()())) == 6  # test_ratio 0.1: none drawn
    assert list(movielens.test()()) == []


def test_movielens_answers_its_dictionaries_and_maxima(ratings: None) -> None:
    assert movielens.movie_categories() == {"Animation": 0, "Children's": 1, "Comedy": 2,
                                            "Drama": 3}
    assert movielens.get_movie_title_dict() == {"blues": 0, "café": 1, "society": 2, "story": 3,
                                                "toy": 4}
    assert (movielens.max_movie_id(), movielens.max_user_id(), movielens.max_job_id()) == \
        (2, 2, 16)
    assert movielens.movie_info()[2].title == "Café Society Blues "
    assert movielens.user_info()[2].value() == [2, 0, 6, 16]


# -- flowers ----------------------------------------------------------------------------------

COLORS = {1: (200, 100, 50), 2: (10, 20, 30), 3: (0, 255, 128), 4: (1, 2, 3)}
"""Each image's RGB colour (uniform images: any crop, flip or resampling keeps it)."""


@pytest.fixture
def blooms(home: Path) -> None:
    scipy_io = pytest.importorskip("scipy.io")
    image = pytest.importorskip("PIL.Image")
    members = {}
    for i, size in ((3, (300, 260)), (1, (240, 320)), (2, (256, 256)), (4, (230, 230))):
        png = io.BytesIO()
        image.new("RGB", size, COLORS[i]).save(png, format="PNG")  # any format Pillow reads
        members[f"jpg/image_{i:05d}.jpg"] = png.getvalue()
    put(home, "flowers", "102flowers.tgz", tgz(members))
    for name, content in (("imagelabels.mat", {"labels": np.array([[5, 7, 9, 102]])}),
                          ("setid.mat", {"trnid": np.array([[2]]), "tstid": np.array([[1, 3]]),
                                         "valid": np.array([[4]])})):
        out = io.BytesIO()
        scipy_io.savemat(out, content)
        put(home, "flowers", name, out.getvalue())


def flower(i: int) -> list[float]:
    """Image i as the default mappers give it: CHW BGR less the mean, flattened."""
    bgr = np.array(COLORS[i][::-1], np.float32) - np.array(flowers.MEAN, np.float32)
    return np.repeat(bgr, 224 * 224).tolist()


def test_flowers_reads_the_swapped_sets_in_archive_order(blooms: None) -> None:
    random.seed(0)
    train = list(paddle.dataset.flowers.train()())
    assert [label for _, label in train] == [8, 4]  # image 3 (class 9), then image 1 (class 5)
    assert [im.tolist() for im, _ in train] == [flower(3), flower(1)]
    test = list(flowers.test(use_xmap=False)())
    assert [(im.dtype, im.shape, label) for im, label in test] == [(np.float32, (150528,), 6)]
    assert test[0][0].tolist() == flower(2)
    assert [label for _, label in flowers.valid()()] == [101]


def test_flowers_takes_a_mapper_and_cycles(blooms: None) -> None:
    raw = flowers.test(mapper=lambda sample: sample, cycle=True)()
    first, second = next(raw), next(raw)
    assert first == second and first[1] == 6 and first[0].startswith(b"\x89PNG")


def test_flowers_image_helpers_keep_paddles_shapes() -> None:
    pytest.importorskip("PIL")
    im = np.zeros((300, 200, 3), np.uint8)
    assert paddle.dataset.image.resize_short(im, 256).shape == (384, 256, 3)
    assert paddle.dataset.image.center_crop(np.arange(25).reshape(5, 5), 2).tolist() == \
        [[6, 7], [11, 12]]
    assert paddle.dataset.image.simple_transform(im, 256, 224, False).shape == (3, 224, 224)


# -- the CTR sample set -----------------------------------------------------------------------

@pytest.fixture
def clicks(home: Path) -> None:
    put(home, "avazu_ctr_data", "avazu_ctr_data.tgz", tgz({
        "avazu_ctr_data/train.txt": b"1 5 9\t3:1 7:1\t1\n2 6\t4:1\t0\n",
        "avazu_ctr_data/test.txt": b"3\t8:1 9:1\t0\n",
        "avazu_ctr_data/infer.txt": b"4 4\t2:1\n",
        "avazu_ctr_data/data.meta.txt": b"dnn_input_dim: 10\nlr_input_dim: 12\n"}))


def test_ctr_yields_dist_ctr_readers_samples(clicks: None) -> None:
    assert list(paddle.dataset.ctr.train()()) == [[[1, 5, 9], [3, 7], 1], [[2, 6], [4], 0]]
    assert list(ctr.Dataset().test()()) == [[[3], [8, 9], 0]]
    assert list(ctr.infer()()) == [[[4, 4], [2]]]
    assert ctr.load_data_meta() == [10, 12]


def test_flowers_without_scipy_says_what_to_install(blooms: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy.io", None)  # as if scipy were not installed
    with pytest.raises(ImportError, match="pip install scipy pillow"):
        flowers.train()


def test_pslabs_own_data_sets_stay_readers_of_their_first_epoch() -> None:
    first = next(paddle.dataset.synthetic_regression.train()())
    again = next(paddle.dataset.synthetic_regression.train()())
    assert len(first) == 2 and all(np.array_equal(a, b) for a, b in zip(first, again))
    assert paddle.dataset.digits.name == "digits"
