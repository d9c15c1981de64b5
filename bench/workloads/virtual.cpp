// C++ virtual calls: a small class hierarchy called through base-class pointers, in a loop.
// Usage: virtual [ITERATIONS]   (default 150000; 0 returns at once)
// Calls per iteration, over the NSHAPES shapes: area, perimeter and scale of each shape
// (3 virtual calls), and Shape::describe (non-virtual) which makes 2 more virtual calls.
#include "common.h"
#include <memory>
#include <vector>

struct Shape {
    virtual ~Shape() {}
    virtual double area() const = 0;
    virtual double perimeter() const = 0;
    virtual void scale(double k) = 0;
    BENCH_FN double describe() const { return area() * 0.5 + perimeter(); }
};

struct Circle : Shape {
    double r;
    explicit Circle(double r) : r(r) {}
    BENCH_FN double area() const override { return 3.14159265358979 * r * r; }
    BENCH_FN double perimeter() const override { return 2 * 3.14159265358979 * r; }
    BENCH_FN void scale(double k) override { r = r * k + 0.001; }
};

struct Rect : Shape {
    double w, h;
    Rect(double w, double h) : w(w), h(h) {}
    BENCH_FN double area() const override { return w * h; }
    BENCH_FN double perimeter() const override { return 2 * (w + h); }
    BENCH_FN void scale(double k) override { w = w * k + 0.002; h = h * k - 0.001; }
};

struct Square : Rect {
    explicit Square(double s) : Rect(s, s) {}
    BENCH_FN double area() const override { return w * w; }
    BENCH_FN void scale(double k) override { w = w * k + 0.003; h = w; }
};

struct Tri : Shape {
    double a, b, c;
    Tri(double a, double b, double c) : a(a), b(b), c(c) {}
    BENCH_FN double area() const override { return 0.25 * (a + b + c) * (a * 0.1 + b * 0.2); }
    BENCH_FN double perimeter() const override { return a + b + c; }
    BENCH_FN void scale(double k) override { a *= k; b *= k; c = c * k + 0.0005; }
};

static const int NSHAPES = 8;
static const unsigned long long CALLS_PER_SHAPE = 3 + 1 + 2;

int main(int argc, char **argv)
{
    long iters = bench_arg(argc, argv, 1, 150000);
    if (iters <= 0) {
        bench_report_calls(0);
        return 0;
    }
    std::vector<std::unique_ptr<Shape>> shapes;
    shapes.reserve(NSHAPES);
    for (int i = 0; i < NSHAPES / 4; i++) {
        shapes.emplace_back(new Circle(1.0 + i));
        shapes.emplace_back(new Rect(2.0 + i, 3.0));
        shapes.emplace_back(new Square(1.5 + i));
        shapes.emplace_back(new Tri(3.0, 4.0, 5.0 + i));
    }
    double total = 0;
    for (long it = 0; it < iters; it++) {
        double k = (it & 1) ? 1.0001 : 0.9999;
        for (const auto &s : shapes) {
            total += s->area();
            total += s->perimeter() * 1e-3;
            s->scale(k);
            total += s->describe() * 1e-6;
        }
    }
    printf("total=%.6f\n", total);
    bench_report_calls((unsigned long long)iters * NSHAPES * CALLS_PER_SHAPE);
    return 0;
}
