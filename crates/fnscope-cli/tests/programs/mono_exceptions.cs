// Managed exceptions of every origin through hooked frames: thrown by code, raised by the
// runtime from a signal (null dereference, division by zero), rethrown, filtered, run through
// a finally; with an argument, one left unhandled. Each method counts its calls (`COUNT`, at
// the end or when the unhandled exception ends the program).
using System;

class C { public int v; }

static class N { public static int deref, mid, div, rethrow, filtered, fin; }

class E {
    static int Deref(C c) { N.deref++; return c.v; }
    static int Mid(C c) { N.mid++; return Deref(c) + 1; }
    static int Div(int a, int b) { N.div++; return a / b; }
    static void Rethrow() { N.rethrow++; try { Mid(null); } catch (NullReferenceException) { throw; } }
    static int Filtered(int i) {
        N.filtered++;
        try { throw new ArgumentException("a" + i); }
        catch (ArgumentException e) when (e.Message.EndsWith("1")) { return 1; }
        catch { return 2; }
    }
    static void Fin(ref int n) { N.fin++; try { Mid(null); } finally { n++; } }

    static int Main(string[] args) {
        int n = 0;
        for (int i = 0; i < 3; i++) { try { Mid(null); } catch (NullReferenceException) { n++; } }
        try { Div(1, 0); } catch (DivideByZeroException) { n += 10; }
        try { Rethrow(); }
        catch (NullReferenceException e) { n += 100; Console.WriteLine(e.StackTrace); }
        int f = 0;
        for (int i = 0; i < 3; i++) f += Filtered(i);
        int fin = 0;
        try { Fin(ref fin); } catch (NullReferenceException) { }
        Console.WriteLine("n=" + n + " f=" + f + " fin=" + fin);
        if (args.Length > 0) {
            AppDomain.CurrentDomain.UnhandledException += (s, e) => Counts();
            Mid(null);
        }
        Counts();
        return 0;
    }

    static void Counts() {
        Console.WriteLine("COUNT deref " + N.deref);
        Console.WriteLine("COUNT mid " + N.mid);
        Console.WriteLine("COUNT div " + N.div);
        Console.WriteLine("COUNT rethrow " + N.rethrow);
        Console.WriteLine("COUNT filtered " + N.filtered);
        Console.WriteLine("COUNT fin " + N.fin);
    }
}
