#!/usr/bin/env python3
"""Read a run's committed files the way users do, with Polars, DuckDB and pyarrow.

usage: read_committed.py RLA_PIPE_BINARY STORE RUN TABLE COLUMN

Lists the files with `rla-pipe files --format json`, reads them with each library and prints
one JSON object: {"polars": [rows, sum], "duckdb": [...], "pyarrow": [...], "lazy": [...]},
the row count and the sum of COLUMN per reader, for the test to compare with `rla-pipe sql`.

An `s3://` STORE is read with the usual AWS_* environment (AWS_ENDPOINT_URL and AWS_ALLOW_HTTP
for an S3-compatible server), exactly as the README shows. DuckDB reads S3 through its `httpfs`
extension, which DuckDB downloads at run time: offline, "duckdb" is then null.
"""
import json
import os
import subprocess
import sys

import duckdb
import polars as pl
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs


def s3_options():
    """Polars' storage_options and a pyarrow S3FileSystem from the AWS_* environment."""
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL")
    polars = {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "aws_region": env.get("AWS_REGION", "us-east-1"),
    }
    arrow = dict(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
                 region=env.get("AWS_REGION", "us-east-1"))
    if endpoint:
        polars["aws_endpoint_url"] = endpoint
        polars["aws_allow_http"] = env.get("AWS_ALLOW_HTTP", "false")
        scheme, _, host = endpoint.partition("://")
        arrow.update(endpoint_override=host, scheme=scheme)
    return polars, pyarrow.fs.S3FileSystem(**arrow)


def main():
    binary, store, run, table, column = sys.argv[1:]
    listed = json.loads(subprocess.check_output(
        [binary, "files", "--store", store, "--run", run, "--table", table, "--format", "json"]))
    files = [f["url"] for f in listed]
    s3 = store.startswith("s3://")
    storage_options, filesystem = s3_options() if s3 else (None, None)
    out = {}
    df = pl.read_parquet(files, storage_options=storage_options)
    out["polars"] = [df.height, float(df[column].sum())]
    lazy = (pl.scan_parquet(files, storage_options=storage_options)
            .select(pl.len(), pl.col(column).sum()).collect())
    out["lazy"] = [int(lazy[0, 0]), float(lazy[0, 1])]
    if s3:
        out["duckdb"] = None
    else:
        [(rows, total)] = duckdb.sql(
            f"SELECT count(*), sum({column}) FROM read_parquet({files!r})").fetchall()
        out["duckdb"] = [rows, float(total)]
    if s3:
        t = ds.dataset([f.removeprefix("s3://") for f in files], format="parquet",
                       filesystem=filesystem).to_table()
    else:
        t = ds.dataset(files, format="parquet").to_table()
    out["pyarrow"] = [t.num_rows, float(pc.sum(t[column]).as_py())]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
