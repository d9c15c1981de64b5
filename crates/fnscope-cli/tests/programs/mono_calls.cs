// Managed calls of every kind, each method counting its own calls (Interlocked, so that the
// worker threads' calls are counted too). The last lines give the counts as `COUNT key n`;
// the test compares them with the calls fnscope recorded. Argument: the worker threads' work.
using System;
using System.Collections.Generic;
using System.Threading;

static class N {
    public static int fib, speakDog, speakCat, areaSquare, areaCircle, boxInt, boxString, max;
    public static int level1, level2, level3, catcher, worker, update, cctor, deep;
}

interface IShape { double Area(); }
class Square : IShape {
    double s;
    public Square(double s) { this.s = s; }
    public double Area() { Interlocked.Increment(ref N.areaSquare); return s * s; }
}
class Circle : IShape {
    double r;
    public Circle(double r) { this.r = r; }
    public double Area() { Interlocked.Increment(ref N.areaCircle); return 3 * r * r; }
}

abstract class Animal { public abstract string Speak(); }
class Dog : Animal { public override string Speak() { Interlocked.Increment(ref N.speakDog); return "woof"; } }
class Cat : Animal { public override string Speak() { Interlocked.Increment(ref N.speakCat); return "meow"; } }

class Box<T> {
    T v;
    public Box(T v) { this.v = v; }
    public T Get() {
        if (typeof(T) == typeof(int)) Interlocked.Increment(ref N.boxInt); else Interlocked.Increment(ref N.boxString);
        return v;
    }
}

static class Config {
    public static readonly int Scale;
    static Config() { Interlocked.Increment(ref N.cctor); Scale = DateTime.Now.Year > 2000 ? 3 : 4; }
}

class HitEffectController {
    int hits;
    public void Update() { Interlocked.Increment(ref N.update); hits++; }
    public int Hits { get { return hits; } }
}

class P {
    static int Fib(int n) { Interlocked.Increment(ref N.fib); return n < 2 ? n : Fib(n - 1) + Fib(n - 2); }

    static T Max<T>(T a, T b) where T : IComparable<T> { Interlocked.Increment(ref N.max); return a.CompareTo(b) >= 0 ? a : b; }

    static void Level1(int i) { Interlocked.Increment(ref N.level1); if (i % 3 != 2) throw new InvalidOperationException("boom " + i); }
    static void Level2(int i) { Interlocked.Increment(ref N.level2); Level1(i); }
    static void Level3(int i) { Interlocked.Increment(ref N.level3); Level2(i); }
    static string Catcher(int i) {
        Interlocked.Increment(ref N.catcher);
        try { Level3(i); return "none"; }
        catch (InvalidOperationException e) { return e.Message + " via " + e.StackTrace.Split('\n').Length + " frames"; }
    }

    static long Deep(int depth) {
        Interlocked.Increment(ref N.deep);
        var junk = new byte[64];
        if (depth == 0) { GC.Collect(); GC.WaitForPendingFinalizers(); return junk.Length; }
        return Deep(depth - 1) + junk.Length;
    }

    static void Worker(object o) {
        Interlocked.Increment(ref N.worker);
        int rounds = (int)o;
        var h = new HitEffectController();
        for (int i = 0; i < rounds; i++) { h.Update(); Fib(i % 8); }
    }

    static int Main(string[] args) {
        int rounds = args.Length > 0 ? int.Parse(args[0]) : 50;
        Console.WriteLine("fib(16) = " + Fib(16));
        var shapes = new List<IShape>();
        for (int i = 0; i < 7; i++) shapes.Add(i % 3 == 0 ? (IShape)new Circle(i) : new Square(i));
        double area = 0;
        foreach (var s in shapes) area += s.Area();
        Console.WriteLine("area = " + area);
        Animal[] zoo = { new Dog(), new Cat(), new Dog(), new Dog(), new Cat() };
        string talk = "";
        foreach (var a in zoo) talk += a.Speak() + " ";
        Console.WriteLine(talk.Trim());
        var bi = new Box<int>(Config.Scale);
        var bs = new Box<string>("box");
        int sum = 0;
        for (int i = 0; i < 4; i++) sum += bi.Get() + bs.Get().Length;
        Console.WriteLine("boxes = " + sum + ", max = " + Max(3, 9) + " " + Max("a", "b") + " " + Max(2.5, 1.5));
        for (int i = 0; i < 6; i++) Console.WriteLine(Catcher(i));
        Console.WriteLine("deep = " + Deep(2000));
        var threads = new Thread[4];
        for (int i = 0; i < threads.Length; i++) { threads[i] = new Thread(Worker); threads[i].Start(rounds); }
        foreach (var t in threads) t.Join();
        var trace = Environment.StackTrace;
        Console.WriteLine("stack trace names Main: " + trace.Contains("P.Main"));
        Console.WriteLine(trace.Substring(trace.IndexOf("at P.Main")));
        Console.WriteLine("calling method: " + new System.Diagnostics.StackFrame(0).GetMethod().Name);
        Console.WriteLine("COUNT fib " + N.fib);
        Console.WriteLine("COUNT max " + N.max);
        Console.WriteLine("COUNT speakDog " + N.speakDog);
        Console.WriteLine("COUNT speakCat " + N.speakCat);
        Console.WriteLine("COUNT areaSquare " + N.areaSquare);
        Console.WriteLine("COUNT areaCircle " + N.areaCircle);
        Console.WriteLine("COUNT boxInt " + N.boxInt);
        Console.WriteLine("COUNT boxString " + N.boxString);
        Console.WriteLine("COUNT level1 " + N.level1);
        Console.WriteLine("COUNT level2 " + N.level2);
        Console.WriteLine("COUNT level3 " + N.level3);
        Console.WriteLine("COUNT catcher " + N.catcher);
        Console.WriteLine("COUNT deep " + N.deep);
        Console.WriteLine("COUNT worker " + N.worker);
        Console.WriteLine("COUNT update " + N.update);
        Console.WriteLine("COUNT cctor " + N.cctor);
        return 3;
    }
}
