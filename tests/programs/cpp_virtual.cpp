// C++ as people write it: virtual calls through base pointers, function and class templates
// instantiated for several types, overloads, operators, a functor and a comparator called by
// std::sort (a template instantiated in this executable). Checks that such functions are
// hooked, counted exactly and reported under their demangled names - the names printed here
// are the ones c++filt gives, and the test checks them against `nm -C` before using them.
#include <algorithm>
#include <vector>

#include "counts.h"

namespace geo {

struct Shape {
    virtual ~Shape() = default;
    virtual double area() const = 0;
    virtual int sides() const { return 0; }
};

struct Circle : Shape {
    double r;
    explicit Circle(double r_) : r(r_) {}
    double area() const override;
};

struct Square : Shape {
    double s;
    explicit Square(double s_) : s(s_) {}
    double area() const override;
    int sides() const override;
};

COUNTER(circle_area);
COUNTER(square_area);
COUNTER(square_sides);
COUNTER(by_area);
COUNTER(mix_ii);
COUNTER(mix_dd);
COUNTER(scale_call);
// One counter per template instantiation.
template <typename T>
unsigned long twice_calls;
template <typename T>
unsigned long push_calls;
template <typename T>
unsigned long pop_calls;

NOINLINE double Circle::area() const
{
    HIT(circle_area);
    return 3.0 * r * r;
}

NOINLINE double Square::area() const
{
    HIT(square_area);
    return s * s;
}

NOINLINE int Square::sides() const
{
    HIT(square_sides);
    return 4;
}

NOINLINE bool by_area(const Shape *a, const Shape *b)
{
    HIT(by_area);
    return a->area() < b->area();
}

template <typename T>
NOINLINE T twice(T x)
{
    __atomic_fetch_add(&twice_calls<T>, 1, __ATOMIC_RELAXED);
    return x + x;
}

NOINLINE int mix(int a, int b)
{
    HIT(mix_ii);
    return a * 31 + b;
}

NOINLINE double mix(double a, double b)
{
    HIT(mix_dd);
    return a * 0.5 + b;
}

struct Scale {
    double k;
    double operator()(double x) const;
};

NOINLINE double Scale::operator()(double x) const
{
    HIT(scale_call);
    return k * x;
}

template <typename T>
class Stack {
    std::vector<T> items;

  public:
    void push(T v);
    T pop();
    bool empty() const { return items.empty(); }
};

template <typename T>
NOINLINE void Stack<T>::push(T v)
{
    __atomic_fetch_add(&push_calls<T>, 1, __ATOMIC_RELAXED);
    items.push_back(v);
}

template <typename T>
NOINLINE T Stack<T>::pop()
{
    __atomic_fetch_add(&pop_calls<T>, 1, __ATOMIC_RELAXED);
    T v = items.back();
    items.pop_back();
    return v;
}

} // namespace geo

int main(int argc, char **)
{
    using namespace geo;
    std::vector<Shape *> shapes;
    for (int i = 0; i < 60; i++) {
        double size = (i * 37 % 60) + argc;
        if (i % 3 == 0)
            shapes.push_back(new Circle(size / 10));
        else
            shapes.push_back(new Square(size / 7));
    }

    double total = 0;
    int sides = 0;
    for (int round = 0; round < 10; round++)
        for (const Shape *s : shapes) {
            total += s->area();
            sides += s->sides();
        }
    std::sort(shapes.begin(), shapes.end(), by_area);
    bool sorted = std::is_sorted(shapes.begin(), shapes.end(),
                                 [](const Shape *a, const Shape *b) {
                                     return a->area() < b->area();
                                 });
    printf("total area %.3f sides %d sorted %s\n", total, sides, sorted ? "yes" : "no");

    long ti = 0;
    double td = 0;
    for (int i = 0; i < 100; i++) {
        ti += twice(i + argc);
        td += twice(i * 0.25);
        ti += mix(i, argc);
        td += mix(i * 0.5, 1.0);
    }
    long tl = twice(123456789L);
    Scale sc{2.5};
    for (int i = 0; i < 50; i++)
        td += sc(i);
    printf("templates %ld %.3f %ld\n", ti, td, tl);

    Stack<int> si;
    Stack<double> sd;
    for (int i = 0; i < 30; i++) {
        si.push(i);
        sd.push(i * 1.5);
    }
    long popped = 0;
    while (!si.empty())
        popped += si.pop();
    while (!sd.empty())
        popped += static_cast<long>(sd.pop());
    printf("popped %ld\n", popped);

    for (Shape *s : shapes)
        delete s;

    print_count("count", "geo::Circle::area() const", CALLS(circle_area));
    print_count("count", "geo::Square::area() const", CALLS(square_area));
    print_count("count", "geo::Square::sides() const", CALLS(square_sides));
    print_count("count", "geo::by_area(geo::Shape const*, geo::Shape const*)", CALLS(by_area));
    print_count("count", "int geo::twice<int>(int)", twice_calls<int>);
    print_count("count", "double geo::twice<double>(double)", twice_calls<double>);
    print_count("count", "long geo::twice<long>(long)", twice_calls<long>);
    print_count("count", "geo::mix(int, int)", CALLS(mix_ii));
    print_count("count", "geo::mix(double, double)", CALLS(mix_dd));
    print_count("count", "geo::Scale::operator()(double) const", CALLS(scale_call));
    print_count("count", "geo::Stack<int>::push(int)", push_calls<int>);
    print_count("count", "geo::Stack<double>::push(double)", push_calls<double>);
    print_count("count", "geo::Stack<int>::pop()", pop_calls<int>);
    print_count("count", "geo::Stack<double>::pop()", pop_calls<double>);
    return 0;
}
