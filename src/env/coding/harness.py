# rla-pipe's harness for function-call tests (`TestCase::harness`, src/env/coding/mod.rs): the
# program, then the test, run in a namespace of their own, and only once the test has run to its
# end (HumanEval's `check(candidate)` returned, or a written call compared) does the harness
# write the run's token to stdout. rla-pipe makes a fresh random token for every run and passes
# it on stdin (never in this file, which the program can read); the harness reads it before any
# of the program runs and gives the program an empty stdin instead. A program that exits early
# (`sys.exit`, `raise SystemExit`, `os._exit`) or fails leaves no token: the test did not pass.
# What the program did to the builtins is undone before the test is read, and trace and profile
# hooks are removed.
import builtins as _builtins
import os as _os
import sys as _sys


def _rla_pipe_run(program, test, kind, arg):
    read, write, exit_ = _os.read, _os.write, _os._exit
    compile_, exec_, eval_, str_ = compile, exec, eval, str
    token = b""
    while True:
        chunk = read(0, 4096)
        if not chunk:
            break
        token += chunk
    token = token.strip()
    null = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(null, 0)
    _os.close(null)
    original = dict(_builtins.__dict__)
    settrace, setprofile, stdout = _sys.settrace, _sys.setprofile, _sys.stdout
    namespace = {"__name__": "__main__", "__builtins__": _builtins}
    try:
        exec_(compile_(program, "<program>", "exec"), namespace)
        _builtins.__dict__.clear()
        _builtins.__dict__.update(original)
        namespace["__builtins__"] = _builtins
        settrace(None)
        setprofile(None)
        if kind == "check":
            exec_(compile_(test, "<test>", "exec"), namespace)
            namespace["check"](namespace[arg])
            verdict = b""
        else:
            value = eval_(compile_("(" + test + ") == (" + arg + ")", "<test>", "eval"), namespace)
            verdict = b" True" if str_(value) == "True" else b" False"
    except BaseException:
        try:
            try:
                stdout.flush()
            finally:
                import traceback

                traceback.print_exc()
        finally:
            exit_(1)
    try:
        stdout.flush()
    except BaseException:
        pass
    write(1, b"\n" + token + verdict + b"\n")
    exit_(0)
