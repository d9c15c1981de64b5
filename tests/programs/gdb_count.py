# Counts entries into functions with gdb breakpoints, for check_oracles.sh.
#
#   COUNT_NAMES="name1<US>name2..." COUNT_OUT=file gdb -batch -nx -x gdb_count.py --args PROG
#
# One breakpoint on the first instruction of each named function (names as `nm -C` prints
# them; <US> is the 0x1f unit separator, since C++ names contain spaces and commas). Each
# hit is counted and the program continues. Forked children are kept under gdb and exec'd
# images get the breakpoints again, so the totals cover every process of the run, like the
# programs' own `count` lines do. Writes "name<TAB>entries" lines to COUNT_OUT.
import os

import gdb

names = [n for n in os.environ["COUNT_NAMES"].split("\x1f") if n]
entries = {n: 0 for n in names}


class Entry(gdb.Breakpoint):
    def __init__(self, name):
        # Quoted, so that gdb takes a C++ signature as one symbol name.
        super().__init__("*'%s'" % name, internal=True)
        self.fn = name

    def stop(self):
        entries[self.fn] += 1
        return False  # count and go on


for sig in ["SIGUSR1", "SIGUSR2", "SIGPROF", "SIGTERM", "SIGALRM", "SIGABRT", "SIGCHLD"]:
    gdb.execute("handle %s nostop noprint pass" % sig)
for setting in [
    "pagination off",
    "detach-on-fork off",
    "follow-fork-mode parent",
    "follow-exec-mode same",
    "schedule-multiple on",
    "print inferior-events off",
    "print thread-events off",
]:
    gdb.execute("set " + setting)
for n in names:
    Entry(n)

gdb.execute("run </dev/null >/dev/null 2>/dev/null")
# Children that are still stopped (fork with detach-on-fork off) are resumed until every
# process has finished.
for _ in range(100):
    live = [i for i in gdb.inferiors() if i.pid]
    if not live:
        break
    try:
        gdb.execute("inferior %d" % live[0].num, to_string=True)
        gdb.execute("continue", to_string=True)
    except gdb.error:
        break

with open(os.environ["COUNT_OUT"], "w") as out:
    for n in names:
        out.write("%s\t%d\n" % (n, entries[n]))
