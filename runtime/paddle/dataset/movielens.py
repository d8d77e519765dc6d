"""``paddle.dataset.movielens``: MovieLens 1M of ``ml-1m.zip`` from Paddle's cache,
``DATA_HOME/movielens`` (`common`; Paddle 2's name for it, ``movielens%2Fml-1m.zip``, is found
too): ``ml-1m/movies.dat``, ``users.dat`` and ``ratings.dat`` (``::``-separated, Latin-1).

A sample is Paddle's list ``[user_id, gender, age, job_id, movie_id, category_ids,
title_word_ids, [score]]``: gender 0 for M and 1 for F, age the index of the user's age in
`age_table`, the title's words lower-cased with its ``(year)`` left out, score the rating
``* 2 - 5``. A rating is a test sample when a draw of ``np.random.RandomState(rand_seed)``, one
per line in file order, is below `test_ratio` (Paddle seeds numpy's global generator with the
same stream; this one leaves it alone). One difference: Paddle numbers the categories and the
title words in the order of a Python set, which changes with each process's string hashing;
here they are numbered in sorted order, so every trainer agrees.
"""

from __future__ import annotations

import functools
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from runtime.paddle.dataset.common import Source, locate
from runtime.paddle.reader import Reader

__all__ = ["MovieInfo", "UserInfo", "age_table", "fetch", "get_movie_title_dict",
           "max_job_id", "max_movie_id", "max_user_id", "movie_categories", "movie_info",
           "test", "train", "user_info"]

SOURCE = Source("http://files.grouplens.org/datasets/movielens/ml-1m.zip",
                "c4d9eecfca2ab87c1945afe126590906", also=("movielens%2Fml-1m.zip",))
age_table = [1, 18, 25, 35, 45, 50, 56]
TITLE = re.compile(r"^(.*)\((\d+)\)$")


@dataclass(frozen=True)
class MovieInfo:
    """A movie: its id, categories and title (without the year)."""

    index: int
    categories: tuple[str, ...]
    title: str


@dataclass(frozen=True)
class UserInfo:
    """A user: id, whether male, index of the age in `age_table`, job id."""

    index: int
    is_male: bool
    age: int
    job_id: int

    def value(self) -> list[int]:
        return [self.index, 0 if self.is_male else 1, self.age, self.job_id]


@dataclass(frozen=True)
class Meta:
    """What the reader needs of movies.dat and users.dat."""

    movies: dict[int, MovieInfo]
    users: dict[int, UserInfo]
    titles: dict[str, int]
    categories: dict[str, int]

    def movie_value(self, movie: MovieInfo) -> list[Any]:
        return [movie.index, [self.categories[c] for c in movie.categories],
                [self.titles[w.lower()] for w in movie.title.split()]]


def _lines(package: zipfile.ZipFile, name: str) -> Iterator[list[str]]:
    with package.open(f"ml-1m/{name}") as f:
        for line in f:
            yield line.decode("latin-1").strip().split("::")


def _movie(fields: list[str]) -> MovieInfo:
    movie_id, title, categories = fields
    match = TITLE.match(title)
    if match is None:
        raise ValueError(f"movies.dat: title {title!r} does not end in (year)")
    return MovieInfo(int(movie_id), tuple(categories.split("|")), match.group(1))


def _user(fields: list[str]) -> UserInfo:
    uid, gender, age, job, _ = fields
    return UserInfo(int(uid), gender == "M", age_table.index(int(age)), int(job))


@functools.lru_cache(maxsize=4)
def _meta(path: Path, mtime_ns: int) -> Meta:
    with zipfile.ZipFile(path) as package:
        movies = {m.index: m for m in map(_movie, _lines(package, "movies.dat"))}
        users = {u.index: u for u in map(_user, _lines(package, "users.dat"))}
    words = sorted({w.lower() for m in movies.values() for w in m.title.split()})
    categories = sorted({c for m in movies.values() for c in m.categories})
    return Meta(movies, users, {w: i for i, w in enumerate(words)},
                {c: i for i, c in enumerate(categories)})


def _archive() -> tuple[Path, Meta]:
    path = locate("movielens", SOURCE)[0]
    return path, _meta(path, path.stat().st_mtime_ns)


def _samples(rand_seed: int, test_ratio: float, is_test: bool) -> Iterator[list[Any]]:
    path, meta = _archive()
    draws = np.random.RandomState(rand_seed)
    with zipfile.ZipFile(path) as package:
        for fields in _lines(package, "ratings.dat"):
            if (draws.random_sample() < test_ratio) == is_test:
                uid, movie_id, rating = int(fields[0]), int(fields[1]), float(fields[2])
                yield (meta.users[uid].value() + meta.movie_value(meta.movies[movie_id])
                       + [[rating * 2 - 5.0]])


def train(rand_seed: int = 0, test_ratio: float = 0.1) -> Reader:
    """The ratings not drawn for the test set."""
    _archive()
    return lambda: _samples(rand_seed, test_ratio, False)


def test(rand_seed: int = 0, test_ratio: float = 0.1) -> Reader:
    """The ratings drawn (with probability `test_ratio`) for the test set."""
    _archive()
    return lambda: _samples(rand_seed, test_ratio, True)


def get_movie_title_dict() -> dict[str, int]:
    """Lower-cased title word -> id."""
    return _archive()[1].titles


def movie_categories() -> dict[str, int]:
    """Category -> id."""
    return _archive()[1].categories


def movie_info() -> dict[int, MovieInfo]:
    return _archive()[1].movies


def user_info() -> dict[int, UserInfo]:
    return _archive()[1].users


def max_movie_id() -> int:
    return max(movie_info())


def max_user_id() -> int:
    return max(user_info())


def max_job_id() -> int:
    return max(u.job_id for u in user_info().values())


def fetch() -> None:
    """Paddle downloads the archive; here it must be there already."""
    _archive()
