#!/usr/bin/env python3
"""Read a run's committed files the way users do, with Polars, DuckDB and pyarrow.

usage: read_committed.py RLA_PIPE_BINARY STORE RUN TABLE COLUMN

Lists the files with `rla-pipe files --format json`, reads them with each library and prints
one JSON object: {"polars": [rows, sum], "duckdb": [...], "pyarrow": [...], "lazy": [...]},
the row count and the sum of COLUMN per reader, for the test to compare with `rla-pipe sql`.
"""
import json
import subprocess
import sys

import duckdb
import polars as pl
import pyarrow.compute as pc
import pyarrow.dataset as ds


def main():
    binary, store, run, table, column = sys.argv[1:]
    listed = json.loads(subprocess.check_output(
        [binary, "files", "--store", store, "--run", run, "--table", table, "--format", "json"]))
    files = [f["url"] for f in listed]
    out = {}
    df = pl.read_parquet(files)
    out["polars"] = [df.height, float(df[column].sum())]
    lazy = pl.scan_parquet(files).select(pl.len(), pl.col(column).sum()).collect()
    out["lazy"] = [int(lazy[0, 0]), float(lazy[0, 1])]
    [(rows, total)] = duckdb.sql(
        f"SELECT count(*), sum({column}) FROM read_parquet({files!r})").fetchall()
    out["duckdb"] = [rows, float(total)]
    t = ds.dataset(files, format="parquet").to_table()
    out["pyarrow"] = [t.num_rows, float(pc.sum(t[column]).as_py())]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
