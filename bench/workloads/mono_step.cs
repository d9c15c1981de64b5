// One small managed method called N times (argument), never inlined: the per-call cost of
// tracing managed code is (traced time - native time) / N.
using System;
using System.Runtime.CompilerServices;

class Bench {
    [MethodImpl(MethodImplOptions.NoInlining)]
    static int Step(int x) { return x * 3 + 1; }

    static int Main(string[] args) {
        int n = int.Parse(args[0]);
        int acc = 0;
        for (int i = 0; i < n; i++) acc = Step(acc) & 0xffff;
        Console.WriteLine(acc);
        return 0;
    }
}
