"""MovieLens ratings + movies → the sample-level Parquet that ``gmeta data prepare`` reads.

Why a converter at all: MovieLens keeps movie attributes in a second file and packs them into
strings (the year inside the title, genres as ``A|B|C``). ``prepare`` wants one row per sample
with every feature as a column, so the join and the parsing happen here, once, and the rest of
the pipeline is the same one every user's data goes through.

One row per rating::

    user_id    int64     the task (a cold-start user is a user never seen in training)
    movie_id   int64     categorical: the item
    year       int64     categorical: release year parsed from the title, 0 when absent
    genres     list<int64>  multi-hot: genre indices in GENRES order (no genre → empty list)
    rating     float32   the label (0.5 … 5.0)
    timestamp  int64     seconds since the epoch: prepare's time column (query = latest)

Run ``python examples/movielens/convert.py --out DIR`` (defaults read the vendored copy in
``examples/movielens/data/ml-latest-small``).
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
DEFAULT_SOURCE = HERE / "data" / "ml-latest-small"
OUTPUT_FILE = "ratings.parquet"

# The genre vocabulary of MovieLens' README; "(no genres listed)" maps to an empty list.
GENRES = ["Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "IMAX", "Musical", "Mystery", "Romance", "Sci-Fi",
          "Thriller", "War", "Western"]
_YEAR = re.compile(r"\((\d{4})\)\s*$")


class ConvertError(ValueError):
    """An input file is missing or not in the MovieLens layout (names the file and the row)."""


def _read_csv(path: Path, columns: dict) -> pa.Table:
    if not path.is_file():
        raise ConvertError(f"{path}: not found (expected the MovieLens file {path.name})")
    try:
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=columns))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ConvertError(f"{path}: {e}") from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ConvertError(f"{path}: missing column(s) {missing}; have {table.column_names}")
    return table


def movie_features(movies: pa.Table, source: Path):
    """movieId → (year, genre index list) from the title and genre strings."""
    ids = movies.column("movieId").to_numpy()
    years = np.zeros(len(ids), np.int64)
    genres = []
    index = {g: i for i, g in enumerate(GENRES)}
    for row, (title, gs) in enumerate(zip(movies.column("title").to_pylist(), movies.column("genres").to_pylist())):
        m = _YEAR.search(title or "")
        years[row] = int(m.group(1)) if m else 0
        names = [] if gs in (None, "", "(no genres listed)") else gs.split("|")
        unknown = [g for g in names if g not in index]
        if unknown:
            raise ConvertError(f"{source}, row {row + 2}: unknown genre(s) {unknown} for movie {ids[row]}")
        genres.append([index[g] for g in names])
    return ids, years, genres


def convert(source: Path = DEFAULT_SOURCE, out: Path = Path("data/movielens/raw")) -> Path:
    source, out = Path(source), Path(out)
    ratings = _read_csv(source / "ratings.csv", {"userId": pa.int64(), "movieId": pa.int64(),
                                                  "rating": pa.float32(), "timestamp": pa.int64()})
    movies = _read_csv(source / "movies.csv", {"movieId": pa.int64(), "title": pa.string(), "genres": pa.string()})
    ids, years, genres = movie_features(movies, source / "movies.csv")
    order = np.argsort(ids)
    movie = ratings.column("movieId").to_numpy()
    pos = np.searchsorted(ids[order], movie)
    found = (pos < len(ids)) & (ids[order][np.minimum(pos, len(ids) - 1)] == movie)
    if not found.all():
        bad = int(np.flatnonzero(~found)[0])
        raise ConvertError(f"{source / 'ratings.csv'}, row {bad + 2}: movieId {movie[bad]} is not in movies.csv")
    row_of = order[pos]
    table = pa.table({
        "user_id": ratings.column("userId"),
        "movie_id": ratings.column("movieId"),
        "year": pa.array(years[row_of]),
        "genres": pa.array([genres[r] for r in row_of], pa.list_(pa.int64())),
        "rating": ratings.column("rating"),
        "timestamp": ratings.column("timestamp"),
    })
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{OUTPUT_FILE}.tmp"
    pq.write_table(table, tmp)
    tmp.replace(out / OUTPUT_FILE)  # complete or absent
    return out / OUTPUT_FILE


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="folder with ratings.csv and movies.csv")
    p.add_argument("--out", type=Path, required=True, help="output folder for ratings.parquet")
    a = p.parse_args()
    try:
        path = convert(a.source, a.out)
    except ConvertError as e:
        raise SystemExit(f"error: {e}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
