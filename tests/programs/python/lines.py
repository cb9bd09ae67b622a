"""Allocations on known lines (marked "# at: NAME"): tests/test_python_callsites.py records this
script and checks that each block's call site is its line. Sizes are unique, so that the test
finds each block's event by its size."""
import asyncio
import os
import sys
import threading
import zlib

keep = []


def listcomp(n):
    return [bytearray(1001) for _ in range(n)]  # at: listcomp


def dict_growth(n):
    d = {}
    for i in range(n):
        d[i] = i  # at: dict
    keep.append(bytearray(100_003))  # at: dict_big
    return d


def worker(k):
    for _ in range(20):
        keep.append(bytearray(70_000 + k))  # at: worker


def gen():
    for i in range(3):
        yield bytearray(110_001 + i)  # at: gen


def consume():
    out = []
    for b in gen():
        out.append(b)
        keep.append(bytearray(120_001 + len(out)))  # at: consume
    return out


async def task(k):
    await asyncio.sleep(0)
    keep.append(bytearray(130_001 + k))  # at: task
    await asyncio.sleep(0)
    return k


async def gather():
    return await asyncio.gather(*(task(k) for k in range(3)))


def deep(n):
    if n == 0:
        keep.append(bytearray(140_001))  # at: deep
        raise ValueError("unwind")
    deep(n - 1)


def catcher():
    try:
        deep(5)
    except ValueError:
        pass
    keep.append(bytearray(150_001))  # at: catcher


def child_work():
    keep.append(bytearray(160_001))  # at: child


def compress():
    return zlib.compress(os.urandom(300_000), 9)  # at: zlib


def subinterpreter():
    try:
        import _interpreters as interpreters   # 3.13
    except ImportError:
        import _xxsubinterpreters as interpreters
    sub = interpreters.create()
    interpreters.run_string(sub, "x = bytearray(170_001)\n")  # in a subinterpreter: <string>:1
    interpreters.destroy(sub)


def small_objects(n):
    return [(k, k + 1000) for k in range(n)]  # at: small


def medium_objects(n):
    return [bytes(600 + k % 2) for k in range(n)]  # at: medium


def pools_in_threads():
    def work():
        keep.append(small_objects(5000))
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def churn(data):
    while True:   # allocates in zlib without the GIL until the interpreter exits under it
        zlib.compress(data, 1)


def main(what):
    if "basic" in what:
        listcomp(300)
        dict_growth(3000)
    if "threads" in what:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if "gen" in what:
        consume()
        asyncio.run(gather())
    if "exc" in what:
        catcher()
    if "fork" in what:
        pid = os.fork()
        if pid == 0:
            child_work()
            os._exit(0)
        os.waitpid(pid, 0)
    if "pymalloc" in what:
        keep.append(small_objects(20_000))
        keep.append(medium_objects(1000))
        pools_in_threads()
        pid = os.fork()
        if pid == 0:
            keep.append(small_objects(7000))
            os._exit(0)
        os.waitpid(pid, 0)
    if "ext" in what:
        compress()
    if "sub" in what:
        subinterpreter()
    if "daemon" in what:
        for _ in range(2):
            threading.Thread(target=churn, args=(os.urandom(200_000),), daemon=True).start()
        threading.Event().wait(0.2)
    if "exec" in what:
        os.execv(sys.executable, [sys.executable, __file__, "exc"])


if __name__ == "__main__":
    main(sys.argv[1:])
