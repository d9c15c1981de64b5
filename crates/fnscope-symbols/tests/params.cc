// C++ functions whose DWARF signatures tests/params.rs checks: compiled with g++ -O0 at test
// time.
#define F __attribute__((noinline))

struct Point { int x; int y; };
struct Owner { long v; ~Owner(); };
Owner::~Owner() { v = 0; }
struct Copied { long v; Copied(long v) : v(v) {} Copied(const Copied &o); };
Copied::Copied(const Copied &o) : v(o.v + 1) {}
struct Holder { Owner o; };

class Counter {
public:
    long total;
    F long add(int k, double f);
    F Point at(const char *why) const;
    F static int twice(int k);
};

long Counter::add(int k, double f) { total += k; return total + (long)f; }
Point Counter::at(const char *why) const { return Point{(int)total, why[0]}; }
int Counter::twice(int k) { return 2 * k; }

F long by_ref(const Point &p, Point &&q, bool b) { return p.x + q.y + b; }
F long kept(Owner o, Copied c, Holder h, Point p) { return o.v + c.v + h.o.v + p.x; }
F Owner make(long v) { Owner o; o.v = v; return o; }

int main() {
    Counter c{};
    Point p{1, 2};
    Owner o;
    o.v = 3;
    Holder h;
    h.o.v = 4;
    long r = c.add(1, 2.0) + c.at("w").x + Counter::twice(3) + by_ref(p, Point{3, 4}, true);
    r += kept(o, Copied(5), h, p) + make(6).v;
    return r == 0;
}
