// Renders a parsed Jinja program: scopes as jinja2 has them (a for loop's body gets a fresh scope each
// iteration, a macro sees the scope it was defined in, if blocks share their enclosing scope), Python's
// operators, and the limits that keep a hostile template from running away.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "text/jinja-ast.h"
#include "text/jinja-builtins.h"
#include "text/jinja.h"

namespace td::jinja {
namespace {

using K = Value::Kind;

struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    std::shared_ptr<Frame> parent;

    const Value *find(std::string_view name) const {
        for (const Frame *f = this; f; f = f->parent.get())
            for (const auto &[k, v] : f->vars)
                if (k == name) return &v;
        return nullptr;
    }
    void set(const std::string &name, Value v) {
        for (auto &[k, old] : vars)
            if (k == name) {
                old = std::move(v);
                return;
            }
        vars.emplace_back(name, std::move(v));
    }
};
using FramePtr = std::shared_ptr<Frame>;

enum class Flow { normal, break_, continue_ };

class Interp {
public:
    Interp(const RenderOptions &o) : opt_(o) {}

    Flow render(const Body &body, const FramePtr &frame, std::string &out) {
        for (const Node &n : body) {
            line_ = n.line;
            step();
            const Flow f = render_node(n, frame, out);
            if (f != Flow::normal) return f;
            if (out.size() > opt_.max_output_bytes)
                fail(fmt::format("the output is over {} bytes", opt_.max_output_bytes));
        }
        return Flow::normal;
    }

    int line() const { return line_; }

private:
    void step(size_t n = 1) {
        steps_ += n;
        if (steps_ > opt_.max_steps) fail(fmt::format("over {} steps", opt_.max_steps));
    }
    // What building a value cost: a step per 256 bytes (or list items).
    void charged(const Value &v) {
        if (v.is_string())
            step(v.s.size() / 256);
        else if (v.is_list())
            step(v.list->size() / 256);
    }

    Flow render_node(const Node &n, const FramePtr &frame, std::string &out) {
        switch (n.kind) {
            case Node::Kind::text:
                out += n.text;
                return Flow::normal;
            case Node::Kind::output:
                out += eval(*n.expr, frame).str();
                return Flow::normal;
            case Node::Kind::if_:
                for (const auto &[cond, body] : n.branches)
                    if (!cond || eval(*cond, frame).truthy()) return render(body, frame, out);
                return Flow::normal;
            case Node::Kind::for_:
                return render_for(n, frame, out);
            case Node::Kind::set: {
                Value v = eval(*n.expr, frame);
                assign(n, std::move(v), frame);
                return Flow::normal;
            }
            case Node::Kind::set_block: {
                std::string captured;
                render(n.body, frame, captured);
                Value v = Value::string(std::move(captured));
                if (n.expr) v = apply_filter_chain(*n.expr, std::move(v), frame);
                frame->set(n.targets[0], std::move(v));
                return Flow::normal;
            }
            case Node::Kind::macro:
                frame->set(n.text, make_macro(n, frame));
                return Flow::normal;
            case Node::Kind::filter_block: {
                std::string captured;
                render(n.body, frame, captured);
                out += apply_filter_chain(*n.expr, Value::string(std::move(captured)), frame).str();
                return Flow::normal;
            }
            case Node::Kind::break_:
                return Flow::break_;
            case Node::Kind::continue_:
                return Flow::continue_;
            case Node::Kind::scope:
                return render(n.body, frame, out);
        }
        return Flow::normal;
    }

    void assign(const Node &n, Value v, const FramePtr &frame) {
        if (!n.text.empty()) {
            const Value *ns = frame->find(n.targets[0]);
            if (!ns || !ns->is_dict() || !ns->dict->is_namespace)
                fail(fmt::format("line {}: cannot assign attribute on non-namespace object", n.line));
            if (v.holds_namespace())
                fail(fmt::format("line {}: a namespace cannot hold a namespace", n.line));
            ns->dict->set(n.text, std::move(v));
            return;
        }
        if (n.targets.size() == 1) {
            frame->set(n.targets[0], std::move(v));
            return;
        }
        const List items = iterate(v);
        if (items.size() != n.targets.size())
            fail(fmt::format("line {}: ValueError: cannot unpack {} values into {} names", n.line,
                             items.size(), n.targets.size()));
        for (size_t k = 0; k < items.size(); ++k) frame->set(n.targets[k], items[k]);
    }

    Flow render_for(const Node &n, const FramePtr &frame, std::string &out) {
        const Value seq = eval(*n.expr, frame);
        if (seq.is_none()) fail(fmt::format("line {}: TypeError: 'NoneType' object is not iterable", n.line));
        List items = iterate(seq);
        auto bind = [&](const FramePtr &f, const Value &item) {
            if (n.targets.size() == 1) {
                f->set(n.targets[0], item);
                return;
            }
            const List parts = iterate(item);
            if (parts.size() != n.targets.size())
                fail(fmt::format("line {}: ValueError: cannot unpack {} values into {} names", n.line,
                                 parts.size(), n.targets.size()));
            for (size_t k = 0; k < parts.size(); ++k) f->set(n.targets[k], parts[k]);
        };
        if (n.loop_filter) {
            List kept;
            for (const Value &item : items) {
                step();
                auto f = std::make_shared<Frame>();
                f->parent = frame;
                bind(f, item);
                if (eval(*n.loop_filter, f).truthy()) kept.push_back(item);
            }
            items = std::move(kept);
        }
        if (items.empty()) return n.else_body.empty() ? Flow::normal : render(n.else_body, frame, out);
        const int64_t len = int64_t(items.size());
        for (int64_t k = 0; k < len; ++k) {
            step();
            auto f = std::make_shared<Frame>();
            f->parent = frame;
            Dict loop;
            loop.set("index", Value::integer(k + 1));
            loop.set("index0", Value::integer(k));
            loop.set("revindex", Value::integer(len - k));
            loop.set("revindex0", Value::integer(len - k - 1));
            loop.set("first", Value::boolean(k == 0));
            loop.set("last", Value::boolean(k == len - 1));
            loop.set("length", Value::integer(len));
            loop.set("depth", Value::integer(1));
            loop.set("depth0", Value::integer(0));
            loop.set("previtem",
                     k > 0 ? items[size_t(k - 1)] : Value::undefined("there is no previous item"));
            loop.set("nextitem",
                     k + 1 < len ? items[size_t(k + 1)] : Value::undefined("there is no next item"));
            loop.set("cycle", Value::function([k](CallArgs &a) {
                         if (a.pos.empty()) fail("TypeError: no items for cycling given");
                         return a.pos[size_t(k) % a.pos.size()];
                     }));
            f->set("loop", Value::make_dict(std::move(loop)));
            bind(f, items[size_t(k)]);
            if (render(n.body, f, out) == Flow::break_) break;
        }
        return Flow::normal;
    }

    Value make_macro(const Node &n, const FramePtr &defined_in) {
        const Node *node = &n;
        std::weak_ptr<Frame> scope = defined_in;  // the macro is stored in that frame: no cycle
        return Value::function([this, node, scope](CallArgs &a) {
            FramePtr parent = scope.lock();
            if (!parent) fail("a macro was called after its scope ended");
            if (++depth_ > kMaxDepth) fail(fmt::format("macro calls nested over {} deep", kMaxDepth));
            auto f = std::make_shared<Frame>();
            f->parent = parent;
            List varargs;
            for (size_t k = 0; k < a.pos.size(); ++k) {
                if (k < node->params.size())
                    f->set(node->params[k].first, a.pos[k]);
                else
                    varargs.push_back(a.pos[k]);
            }
            Dict kwargs;
            for (const auto &[key, v] : a.kw) {
                bool is_param = false;
                for (const auto &p : node->params) is_param |= p.first == key;
                if (is_param)
                    f->set(key, v);
                else
                    kwargs.set(key, v);
            }
            for (size_t k = 0; k < node->params.size(); ++k) {
                const auto &[pname, def] = node->params[k];
                bool given = k < a.pos.size();
                for (const auto &kv : a.kw) given |= kv.first == pname;
                if (!given)
                    f->set(pname,
                           def ? eval(*def, f) : Value::undefined(fmt::format("'{}' is undefined", pname)));
            }
            f->set("varargs", Value::make_list(std::move(varargs)));
            f->set("kwargs", Value::make_dict(std::move(kwargs)));
            std::string out;
            const int saved = line_;
            render(node->body, f, out);
            line_ = saved;
            --depth_;
            return Value::string(std::move(out));
        });
    }

    Value lookup(const std::string &name, const FramePtr &frame) {
        if (const Value *v = frame->find(name)) return *v;
        return make_global(name, opt_.now);
    }

    CallArgs eval_args(const Expr &e, size_t first, const FramePtr &frame) {
        CallArgs a;
        for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], frame));
        for (const auto &[k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v, frame));
        return a;
    }

    // A filter expression whose innermost operand is a placeholder, applied to v.
    Value apply_filter_chain(const Expr &chain, Value v, const FramePtr &frame) {
        if (chain.op != Expr::Op::filter) return v;
        v = apply_filter_chain(*chain.args[0], std::move(v), frame);
        CallArgs a = eval_args(chain, 1, frame);
        return apply_filter(chain.name, v, a);
    }

    [[noreturn]] static void type_error(const char *op, const Value &a, const Value &b) {
        fail(fmt::format("TypeError: unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(),
                         b.type_name()));
    }

    static Value arith(const std::string &op, const Value &a, const Value &b) {
        if (a.is_undefined())
            fail("UndefinedError: " + (a.s.empty() ? std::string("value is undefined") : a.s));
        if (b.is_undefined())
            fail("UndefinedError: " + (b.s.empty() ? std::string("value is undefined") : b.s));
        const bool ints =
            (a.kind == K::integer || a.kind == K::boolean) && (b.kind == K::integer || b.kind == K::boolean);
        if (op == "+") {
            if (a.is_string() && b.is_string()) {
                // Markup + str escapes the str (markupsafe), and the sum stays Markup.
                if (!a.is_safe && !b.is_safe) return Value::string(a.s + b.s);
                Value r = Value::string((a.is_safe ? a.s : html_escape(a.s)) +
                                        (b.is_safe ? b.s : html_escape(b.s)));
                r.is_safe = true;
                return r;
            }
            if (a.is_list() && b.is_list()) {
                List l = *a.list;
                l.insert(l.end(), b.list->begin(), b.list->end());
                Value r = Value::make_list(std::move(l));
                r.is_tuple = a.is_tuple;
                return r;
            }
            if (a.is_string())
                fail(fmt::format("TypeError: can only concatenate str (not \"{}\") to str", b.type_name()));
            if (a.is_list())
                fail(fmt::format("TypeError: can only concatenate list (not \"{}\") to list", b.type_name()));
        }
        if (op == "*") {
            const Value *seq = a.is_string() || a.is_list()   ? &a
                               : b.is_string() || b.is_list() ? &b
                                                              : nullptr;
            const Value *cnt = seq == &a ? &b : &a;
            if (seq && (cnt->kind == K::integer || cnt->kind == K::boolean)) {
                const int64_t n = std::max<int64_t>(0, cnt->kind == K::integer ? cnt->i : cnt->b);
                if (n * int64_t(seq->is_string() ? seq->s.size() : seq->list->size()) > (16 << 20))
                    fail("a repeated sequence over 16 MB");
                if (seq->is_string()) {
                    std::string r;
                    for (int64_t k = 0; k < n; ++k) r += seq->s;
                    return Value::string(std::move(r));
                }
                List l;
                for (int64_t k = 0; k < n; ++k) l.insert(l.end(), seq->list->begin(), seq->list->end());
                return Value::make_list(std::move(l));
            }
        }
        if (!a.is_numeric() || !b.is_numeric()) type_error(op.c_str(), a, b);
        const int64_t x = a.kind == K::boolean ? a.b : a.i, y = b.kind == K::boolean ? b.b : b.i;
        const double p = a.as_double(), q = b.as_double();
        // Python's integers do not overflow; ours are 64-bit, and a result past them becomes the nearest
        // double (a template's arithmetic is counters and lengths; a fuzzed one multiplied 2^63 - 1 by
        // 1079853572).
        int64_t r = 0;
        if (op == "+")
            return ints && !__builtin_add_overflow(x, y, &r) ? Value::integer(r) : Value::number(p + q);
        if (op == "-")
            return ints && !__builtin_sub_overflow(x, y, &r) ? Value::integer(r) : Value::number(p - q);
        if (op == "*")
            return ints && !__builtin_mul_overflow(x, y, &r) ? Value::integer(r) : Value::number(p * q);
        if (op == "/") {
            if (q == 0) fail("ZeroDivisionError: division by zero");
            return Value::number(p / q);
        }
        if (op == "//" || op == "%") {
            if (ints && !(x == std::numeric_limits<int64_t>::min() && y == -1)) {
                if (y == 0) fail("ZeroDivisionError: integer division or modulo by zero");
                int64_t d = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    --d;
                    m += y;
                }
                return Value::integer(op == "//" ? d : m);
            }
            if (q == 0) fail("ZeroDivisionError: float division by zero");
            const double d = std::floor(p / q);
            return Value::number(op == "//" ? d : p - d * q);
        }
        if (op == "**") {
            if (ints && y >= 0) {
                if (x == 0 || x == 1) return Value::integer(y == 0 ? 1 : x);
                if (x == -1) return Value::integer(y % 2 == 0 ? 1 : -1);
                r = 1;
                bool over = false;  // |x| >= 2: past 63 factors at most
                for (int64_t k = 0; k < y && !over; ++k) over = __builtin_mul_overflow(r, x, &r);
                if (!over) return Value::integer(r);
            }
            return Value::number(std::pow(p, q));
        }
        type_error(op.c_str(), a, b);
    }

    static bool contains(const Value &container, const Value &item) {
        switch (container.kind) {
            case K::undefined:
                return false;
            case K::string:
                if (!item.is_string())
                    fail(fmt::format("TypeError: 'in <string>' requires string as left operand, not {}",
                                     item.type_name()));
                return container.s.find(item.s) != std::string::npos;
            case K::list:
                for (const Value &x : *container.list)
                    if (values_equal(x, item)) return true;
                return false;
            case K::dict:
                return container.dict->find(dict_key(item)) != nullptr;
            default:
                fail(fmt::format("TypeError: argument of type '{}' is not iterable", container.type_name()));
        }
    }

    Value eval(const Expr &e, const FramePtr &frame) {
        switch (e.op) {
            case Expr::Op::literal:
                return e.value;
            case Expr::Op::name:
                return lookup(e.name, frame);
            case Expr::Op::attr:
                return get_attr(eval(*e.args[0], frame), e.name);
            case Expr::Op::item:
                return get_item(eval(*e.args[0], frame), eval(*e.args[1], frame));
            case Expr::Op::slice: {
                const Value obj = eval(*e.args[0], frame);
                Value parts[3];
                const Value *p[3] = {nullptr, nullptr, nullptr};
                for (int k = 0; k < 3; ++k)
                    if (e.args[size_t(k) + 1]) {
                        parts[k] = eval(*e.args[size_t(k) + 1], frame);
                        p[k] = &parts[k];
                    }
                return get_slice(obj, p[0], p[1], p[2]);
            }
            case Expr::Op::call: {
                const Value fn = eval(*e.args[0], frame);
                CallArgs a = eval_args(e, 1, frame);
                step();
                if (fn.is_undefined())
                    fail("UndefinedError: " + (fn.s.empty() ? std::string("value is undefined") : fn.s));
                if (fn.kind != K::function)
                    fail(fmt::format("TypeError: '{}' object is not callable", fn.type_name()));
                Value r = (*fn.fn)(a);
                charged(r);
                return r;
            }
            case Expr::Op::filter: {
                const Value v = eval(*e.args[0], frame);
                CallArgs a = eval_args(e, 1, frame);
                Value r = apply_filter(e.name, v, a);
                charged(r);
                return r;
            }
            case Expr::Op::test: {
                const Value v = eval(*e.args[0], frame);
                CallArgs a = eval_args(e, 1, frame);
                return Value::boolean(apply_test(e.name, v, a) != e.negated);
            }
            case Expr::Op::not_:
                return Value::boolean(!eval(*e.args[0], frame).truthy());
            case Expr::Op::neg:
            case Expr::Op::pos: {
                const Value v = eval(*e.args[0], frame);
                if (v.kind == K::integer || v.kind == K::boolean) {
                    const int64_t x = v.kind == K::integer ? v.i : v.b;
                    if (e.op == Expr::Op::neg && x == std::numeric_limits<int64_t>::min())
                        return Value::number(-static_cast<double>(x));  // past int64, as + - * above
                    return Value::integer(e.op == Expr::Op::neg ? -x : x);
                }
                if (v.kind == K::number) return Value::number(e.op == Expr::Op::neg ? -v.d : v.d);
                fail(fmt::format("TypeError: bad operand type for unary -: '{}'", v.type_name()));
            }
            case Expr::Op::and_: {
                Value a = eval(*e.args[0], frame);
                return a.truthy() ? eval(*e.args[1], frame) : a;
            }
            case Expr::Op::or_: {
                Value a = eval(*e.args[0], frame);
                return a.truthy() ? a : eval(*e.args[1], frame);
            }
            case Expr::Op::cond:
                if (eval(*e.args[0], frame).truthy()) return eval(*e.args[1], frame);
                return e.args[2] ? eval(*e.args[2], frame)
                                 : Value::undefined("the conditional expression had no else");
            case Expr::Op::list:
            case Expr::Op::tuple: {
                List l;
                for (const auto &x : e.args) l.push_back(eval(*x, frame));
                Value v = Value::make_list(std::move(l));
                v.is_tuple = e.op == Expr::Op::tuple;
                return v;
            }
            case Expr::Op::dict: {
                Dict d;
                for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
                    const Value key = eval(*e.args[k], frame);
                    d.set(dict_key(key), eval(*e.args[k + 1], frame));
                }
                return Value::make_dict(std::move(d));  // depth checked
            }
            case Expr::Op::binary: {
                const Value a = eval(*e.args[0], frame);
                const Value b = eval(*e.args[1], frame);
                const std::string &op = e.name;
                if (op == "~") {
                    Value r = Value::string(a.str() + b.str());
                    charged(r);
                    return r;
                }
                if (op == "==") return Value::boolean(values_equal(a, b));
                if (op == "!=") return Value::boolean(!values_equal(a, b));
                if (op == "<") return Value::boolean(value_less(a, b));
                if (op == ">") return Value::boolean(value_less(b, a));
                if (op == "<=") return Value::boolean(!value_less(b, a));
                if (op == ">=") return Value::boolean(!value_less(a, b));
                if (op == "in") return Value::boolean(contains(b, a) != e.negated);
                Value r = arith(op, a, b);
                charged(r);
                return r;
            }
        }
        return Value::undefined();
    }

    static constexpr int kMaxDepth = 200;
    const RenderOptions &opt_;
    size_t steps_ = 0;
    int depth_ = 0;
    int line_ = 0;
};

Status to_status(const Error &e, int line) {
    if (e.raised) return Status(ErrorKind::invalid_input, e.message);
    if (e.message.rfind("line ", 0) == 0) return invalid_input("chat template {}", e.message);
    return invalid_input("chat template line {}: {}", line, e.message);
}

}  // namespace

Result<Template> Template::parse(std::string_view source) {
    try {
        Template t;
        t.program_ = parse_program(source);
        return t;
    } catch (const Error &e) {
        return to_status(e, 0);
    }
}

Result<std::string> Template::render(const nlohmann::json &variables, const RenderOptions &options) const {
    if (!program_) return invalid_input("chat template: not parsed");
    Interp interp(options);
    try {
        auto root = std::make_shared<Frame>();
        if (variables.is_object())
            for (auto it = variables.begin(); it != variables.end(); ++it)
                root->set(it.key(), Value::from_json(it.value()));
        std::string out;
        interp.render(program_->body, root, out);
        return out;
    } catch (const Error &e) {
        return to_status(e, interp.line());
    }
}

}  // namespace td::jinja
