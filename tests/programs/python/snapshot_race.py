"""Module snapshots written while other threads write their Python frames' lines
(tests/test_record_robustness.py): three threads run freshly compiled code without end (a new
Python frame each time: a "P" line in the .mods file), while the main thread loads ALPHA, calls
it from a new Python line, unloads it, loads BETA in its place and does the same, 150 times;
each library taking the other's place makes the recorder write its whole module snapshot again.

    python snapshot_race.py ALPHA BETA     (tests/programs/dl_loader.c -DLIB, -DLIB -DBETA)
"""
import _ctypes
import ctypes
import sys
import threading

stop = threading.Event()


def new_frames(k):
    i = 0
    while not stop.is_set():
        exec(compile(f"v = [{k}, {i}] * 3", f"<gen{k}-{i}>", "exec"), {})
        i += 1


def call_once(path, function, size, r):
    lib = ctypes.CDLL(path)
    getattr(lib, function).restype = ctypes.c_void_p
    scope = {"lib": lib}
    exec(compile(f"p = lib.{function}({size})", f"<{function}-{r}>", "exec"), scope)
    libc.free(scope["p"])
    handle = lib._handle
    del lib, scope
    _ctypes.dlclose(handle)


libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]
threads = [threading.Thread(target=new_frames, args=(k,)) for k in range(3)]
for t in threads:
    t.start()
try:
    for r in range(150):
        call_once(sys.argv[1], "alpha_alloc", 1111, r)
        call_once(sys.argv[2], "beta_alloc", 2222, r)
finally:
    stop.set()
    for t in threads:
        t.join()
print("done")
