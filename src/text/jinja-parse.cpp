// Jinja's lexer and parser. The lexer applies whitespace control as jinja2 does with trim_blocks and
// lstrip_blocks: a block or comment tag alone on its line takes the line's indentation with it, the newline
// after a block or comment tag is dropped, "-" strips all whitespace on its side and "+" keeps it.
#include <fmt/format.h>

#include <cstdlib>

#include "text/jinja-ast.h"

namespace td::jinja {
namespace {

enum class Tok : uint8_t {
    text,
    var_begin,
    var_end,
    block_begin,
    block_end,
    name,
    string,
    integer,
    number,
    op,
    eof
};

struct Token {
    Tok kind;
    int line;
    std::string text;  // text, name, operator, decoded string
    int64_t i = 0;
    double d = 0;
};

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

class Lexer {
public:
    explicit Lexer(std::string_view raw) {
        // jinja2 normalises newlines and drops one trailing newline (keep_trailing_newline=False).
        src_.reserve(raw.size());
        for (size_t k = 0; k < raw.size(); ++k) {
            if (raw[k] == '\r') {
                if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
                src_ += '\n';
            } else {
                src_ += raw[k];
            }
        }
        if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    }

    std::vector<Token> run() {
        bool line_starting = true;
        size_t pos = 0;
        while (pos < src_.size()) {
            size_t tag = src_.find('{', pos);
            while (tag != std::string::npos &&
                   !(tag + 1 < src_.size() &&
                     (src_[tag + 1] == '{' || src_[tag + 1] == '%' || src_[tag + 1] == '#')))
                tag = src_.find('{', tag + 1);
            if (tag == std::string::npos) {
                emit_text(src_.substr(pos));
                break;
            }
            const char kind = src_[tag + 1];
            const char sign = tag + 2 < src_.size() ? src_[tag + 2] : 0;
            std::string text = src_.substr(pos, tag - pos);
            if (sign == '-') {
                size_t e = text.size();
                while (e > 0 && is_space(text[e - 1])) --e;
                text.resize(e);
            } else if (kind != '{' && sign != '+') {
                const size_t nl = text.rfind('\n');
                const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
                if (l_pos > 0 || line_starting) {
                    bool ws = l_pos < text.size();
                    for (size_t k = l_pos; k < text.size() && ws; ++k) ws = is_space(text[k]);
                    if (ws) text.resize(l_pos);
                }
            }
            emit_text(std::move(text));
            line_ += count_lines(pos, tag);
            pos = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
            if (kind == '#') {
                size_t end = src_.find("#}", pos);
                if (end == std::string::npos) error("missing end of comment tag");
                const char esign = end > pos ? src_[end - 1] : 0;
                line_ += count_lines(pos, end);
                pos = end + 2;
                pos = after_end(pos, esign, true);
            } else {
                const bool var = kind == '{';
                tokens_.push_back({var ? Tok::var_begin : Tok::block_begin, line_, {}});
                char esign = 0;
                pos = lex_tag(pos, var, esign);
                tokens_.push_back({var ? Tok::var_end : Tok::block_end, line_, {}});
                pos = after_end(pos, esign, !var);
            }
            line_starting = pos > 0 && src_[pos - 1] == '\n';
        }
        tokens_.push_back({Tok::eof, line_, {}});
        return std::move(tokens_);
    }

private:
    [[noreturn]] void error(const std::string &what) { fail(fmt::format("line {}: {}", line_, what)); }

    int count_lines(size_t a, size_t b) const {
        int n = 0;
        for (size_t k = a; k < b && k < src_.size(); ++k) n += src_[k] == '\n';
        return n;
    }

    void emit_text(std::string text) {
        if (text.empty()) return;
        tokens_.push_back({Tok::text, line_, std::move(text)});
    }

    // After a tag's end: "-" skips whitespace; trim_blocks drops one newline after a block or comment.
    size_t after_end(size_t pos, char esign, bool block) {
        const size_t start = pos;
        if (esign == '-') {
            while (pos < src_.size() && is_space(src_[pos])) ++pos;
        } else if (esign != '+' && block && pos < src_.size() && src_[pos] == '\n') {
            ++pos;
        }
        line_ += count_lines(start, pos);
        return pos;
    }

    // Lexes a tag's expression tokens up to its end ("}}" or "%}"); returns the position after it.
    size_t lex_tag(size_t pos, bool var, char &esign) {
        const char close = var ? '}' : '%';
        int depth = 0;
        while (true) {
            while (pos < src_.size() && is_space(src_[pos])) {
                line_ += src_[pos] == '\n';
                ++pos;
            }
            if (pos >= src_.size())
                error(var ? "unexpected end of template, expected '}}'"
                          : "unexpected end of template, expected '%}'");
            const char c = src_[pos];
            if (depth == 0) {
                if ((c == '-' || c == '+') && pos + 2 < src_.size() + 0 && src_[pos + 1] == close &&
                    src_[pos + 2] == '}' && (c == '-' || !var)) {
                    esign = c;
                    return pos + 3;
                }
                if (c == close && pos + 1 < src_.size() && src_[pos + 1] == '}') return pos + 2;
            }
            if (is_name_start(c)) {
                size_t e = pos;
                while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
                tokens_.push_back({Tok::name, line_, src_.substr(pos, e - pos)});
                pos = e;
            } else if (is_digit(c)) {
                pos = lex_number(pos);
            } else if (c == '\'' || c == '"') {
                pos = lex_string(pos);
            } else {
                static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                                  "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                                  "|",  "(",  ")",  "[",  "]",  "{",  "}"};
                std::string op;
                for (const char *o : ops)
                    if (src_.compare(pos, std::char_traits<char>::length(o), o) == 0) {
                        op = o;
                        break;
                    }
                if (op.empty()) error(fmt::format("unexpected character '{}'", c));
                if (op == "(" || op == "[" || op == "{") ++depth;
                if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
                tokens_.push_back({Tok::op, line_, op});
                pos += op.size();
            }
        }
    }

    size_t lex_number(size_t pos) {
        size_t e = pos;
        bool is_float = false;
        while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
            is_float = true;
            ++e;
            while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
            size_t k = e + 1;
            if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
            if (k < src_.size() && is_digit(src_[k])) {
                is_float = true;
                e = k;
                while (e < src_.size() && is_digit(src_[e])) ++e;
            }
        }
        std::string digits;
        for (size_t k = pos; k < e; ++k)
            if (src_[k] != '_') digits += src_[k];
        Token t{is_float ? Tok::number : Tok::integer, line_, digits};
        if (is_float)
            t.d = std::strtod(digits.c_str(), nullptr);
        else
            t.i = std::strtoll(digits.c_str(), nullptr, 10);
        tokens_.push_back(std::move(t));
        return e;
    }

    void append_cp(std::string &out, uint32_t cp) {
        if (cp >= 0x110000) error("an escape beyond U+10FFFF in a string");
        const char32_t c = cp;
        out += utf8_encode(std::u32string_view(&c, 1));
    }

    // A quoted string; escapes decoded as Python's unicode-escape does (unknown ones kept as written).
    size_t lex_string(size_t pos) {
        const char q = src_[pos];
        std::string out;
        size_t k = pos + 1;
        const int line = line_;
        while (true) {
            if (k >= src_.size()) error("unterminated string");
            const char c = src_[k];
            if (c == q) break;
            if (c == '\n') ++line_;
            if (c != '\\' || k + 1 >= src_.size()) {
                out += c;
                ++k;
                continue;
            }
            const char e = src_[k + 1];
            k += 2;
            auto hex = [&](int n) {
                if (k + n > src_.size()) error("truncated escape in a string");
                const std::string h = src_.substr(k, size_t(n));
                for (char x : h)
                    if (!std::isxdigit(static_cast<unsigned char>(x))) error("bad escape in a string");
                k += size_t(n);
                return uint32_t(std::strtoul(h.c_str(), nullptr, 16));
            };
            switch (e) {
                case 'n':
                    out += '\n';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case '\\':
                    out += '\\';
                    break;
                case '\'':
                    out += '\'';
                    break;
                case '"':
                    out += '"';
                    break;
                case 'a':
                    out += '\a';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'v':
                    out += '\v';
                    break;
                case '\n':
                    ++line_;
                    break;
                case 'x':
                    append_cp(out, hex(2));
                    break;
                case 'u':
                    append_cp(out, hex(4));
                    break;
                case 'U':
                    append_cp(out, hex(8));
                    break;
                default:
                    if (e >= '0' && e <= '7') {
                        uint32_t v = uint32_t(e - '0');
                        for (int n = 0; n < 2 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7';
                             ++n, ++k)
                            v = v * 8 + uint32_t(src_[k] - '0');
                        append_cp(out, v);
                    } else {
                        out += '\\';
                        out += e;
                    }
            }
        }
        tokens_.push_back({Tok::string, line, std::move(out)});
        return k + 1;
    }

    std::string src_;
    std::vector<Token> tokens_;
    int line_ = 1;
};

class Parser {
public:
    explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

    std::unique_ptr<Program> run() {
        auto p = std::make_unique<Program>();
        std::string end;
        p->body = parse_body({}, end);
        return p;
    }

private:
    const Token &peek(size_t ahead = 0) const { return t_[std::min(k_ + ahead, t_.size() - 1)]; }
    Token next() {
        Token t = peek();
        if (k_ < t_.size() - 1) ++k_;
        return t;
    }
    [[noreturn]] void error(const std::string &what) const {
        fail(fmt::format("line {}: {}", peek().line, what));
    }
    bool is_op(std::string_view op, size_t ahead = 0) const {
        return peek(ahead).kind == Tok::op && peek(ahead).text == op;
    }
    bool is_name(std::string_view n, size_t ahead = 0) const {
        return peek(ahead).kind == Tok::name && peek(ahead).text == n;
    }
    bool accept_op(std::string_view op) {
        if (!is_op(op)) return false;
        next();
        return true;
    }
    bool accept_name(std::string_view n) {
        if (!is_name(n)) return false;
        next();
        return true;
    }
    void expect_op(std::string_view op) {
        if (!accept_op(op)) error(fmt::format("expected '{}', got {}", op, describe(peek())));
    }
    void expect_block_end() {
        if (peek().kind != Tok::block_end) error(fmt::format("expected '%}}', got {}", describe(peek())));
        next();
    }
    std::string expect_name() {
        if (peek().kind != Tok::name) error(fmt::format("expected a name, got {}", describe(peek())));
        return next().text;
    }
    static std::string describe(const Token &t) {
        switch (t.kind) {
            case Tok::eof:
                return "the end of the template";
            case Tok::block_end:
                return "'%}'";
            case Tok::var_end:
                return "'}}'";
            case Tok::text:
                return "text";
            case Tok::string:
                return "a string";
            default:
                return "'" + t.text + "'";
        }
    }

    // Statements until one of `ends` ({% endfor %}, {% else %}, ...); `end` gets the one found, its tag
    // consumed up to (not including) the rest of the tag's tokens.
    Body parse_body(std::initializer_list<std::string_view> ends, std::string &end) {
        Body body;
        while (true) {
            const Token &t = peek();
            if (t.kind == Tok::eof) {
                if (ends.size() == 0) return body;
                error(fmt::format("unexpected end of template, expected '{}'", *ends.begin()));
            }
            if (t.kind == Tok::text) {
                Node n;
                n.kind = Node::Kind::text;
                n.line = t.line;
                n.text = next().text;
                body.push_back(std::move(n));
            } else if (t.kind == Tok::var_begin) {
                nodes_in_tag_ = 0;
                Node n;
                n.kind = Node::Kind::output;
                n.line = next().line;
                n.expr = parse_expr();
                if (peek().kind != Tok::var_end)
                    error(fmt::format("expected '}}}}', got {}", describe(peek())));
                next();
                body.push_back(std::move(n));
            } else if (t.kind == Tok::block_begin) {
                nodes_in_tag_ = 0;
                next();
                if (peek().kind != Tok::name) error("expected a statement name");
                const std::string word = peek().text;
                for (std::string_view e : ends)
                    if (word == e) {
                        next();
                        end = word;
                        return body;
                    }
                body.push_back(parse_statement());
            } else {
                error(fmt::format("unexpected {}", describe(t)));
            }
        }
    }

    Node parse_statement() {
        Nest nest(*this);
        Node n;
        n.line = peek().line;
        const std::string word = next().text;
        std::string end;
        if (word == "if") {
            n.kind = Node::Kind::if_;
            ExprPtr cond = parse_expr();
            while (true) {
                expect_block_end();
                Body b = parse_body({"elif", "else", "endif"}, end);
                n.branches.emplace_back(std::move(cond), std::move(b));
                if (end == "elif") {
                    cond = parse_expr();
                } else if (end == "else") {
                    expect_block_end();
                    n.branches.emplace_back(nullptr, parse_body({"endif"}, end));
                    expect_block_end();
                    break;
                } else {
                    expect_block_end();
                    break;
                }
            }
        } else if (word == "for") {
            n.kind = Node::Kind::for_;
            n.targets.push_back(expect_name());
            while (accept_op(",")) n.targets.push_back(expect_name());
            if (!accept_name("in")) error("expected 'in' in a for loop");
            n.expr = parse_or_cond(false);
            if (accept_name("if")) n.loop_filter = parse_or_cond(false);
            if (accept_name("recursive")) error("recursive loops are not supported");
            expect_block_end();
            n.body = parse_body({"else", "endfor"}, end);
            if (end == "else") {
                expect_block_end();
                n.else_body = parse_body({"endfor"}, end);
            }
            expect_block_end();
        } else if (word == "set") {
            n.targets.push_back(expect_name());
            if (accept_op(".")) n.text = expect_name();
            while (n.text.empty() && accept_op(",")) n.targets.push_back(expect_name());
            if (accept_op("=")) {
                n.kind = Node::Kind::set;
                n.expr = parse_tuple_or_expr();
                expect_block_end();
            } else {
                if (n.targets.size() != 1 || !n.text.empty()) error("expected '=' in a set statement");
                n.kind = Node::Kind::set_block;
                if (is_op("|")) n.expr = parse_filters(placeholder());
                expect_block_end();
                n.body = parse_body({"endset"}, end);
                expect_block_end();
            }
        } else if (word == "macro") {
            n.kind = Node::Kind::macro;
            n.text = expect_name();
            expect_op("(");
            while (!accept_op(")")) {
                std::string p = expect_name();
                ExprPtr def;
                if (accept_op("=")) def = parse_expr();
                n.params.emplace_back(std::move(p), std::move(def));
                if (!is_op(")")) expect_op(",");
            }
            expect_block_end();
            n.body = parse_body({"endmacro"}, end);
            if (peek().kind == Tok::name) next();  // {% endmacro name %}
            expect_block_end();
        } else if (word == "filter") {
            n.kind = Node::Kind::filter_block;
            n.expr = parse_filter_chain(placeholder());
            expect_block_end();
            n.body = parse_body({"endfilter"}, end);
            expect_block_end();
        } else if (word == "break" || word == "continue") {
            n.kind = word == "break" ? Node::Kind::break_ : Node::Kind::continue_;
            expect_block_end();
        } else if (word == "generation") {
            n.kind = Node::Kind::scope;
            expect_block_end();
            n.body = parse_body({"endgeneration"}, end);
            expect_block_end();
        } else {
            error(fmt::format("unknown or unsupported statement '{}'", word));
        }
        return n;
    }

    ExprPtr make(Expr::Op op, int line) {
        // Chains (a.b.c..., a|f|g..., a + b + c ...) nest without recursion in the parser; bounding the nodes
        // of one tag bounds the depth that evaluating and freeing them recurses to.
        if (++nodes_in_tag_ > kMaxNodesPerTag)
            error(fmt::format("an expression of over {} parts", kMaxNodesPerTag));
        auto e = std::make_unique<Expr>();
        e->op = op;
        e->line = line;
        return e;
    }
    ExprPtr placeholder() { return make(Expr::Op::literal, peek().line); }

    // A filter chain without the leading "|": {% filter trim %}, {% filter indent(2) | upper %}.
    ExprPtr parse_filter_chain(ExprPtr operand) {
        ExprPtr e = parse_one_filter(std::move(operand));
        return parse_filters(std::move(e));
    }

    ExprPtr parse_one_filter(ExprPtr operand) {
        auto f = make(Expr::Op::filter, peek().line);
        f->name = expect_name();
        while (accept_op(".")) f->name += "." + expect_name();
        f->args.push_back(std::move(operand));
        if (is_op("(")) parse_call_args(*f);
        return f;
    }

    ExprPtr parse_filters(ExprPtr e) {
        while (accept_op("|")) e = parse_one_filter(std::move(e));
        return e;
    }

    // "a, b" without brackets (set x = a, b) is a tuple.
    ExprPtr parse_tuple_or_expr() {
        const int line = peek().line;
        ExprPtr first = parse_expr();
        if (!is_op(",")) return first;
        auto t = make(Expr::Op::tuple, line);
        t->args.push_back(std::move(first));
        while (accept_op(",")) {
            if (peek().kind == Tok::block_end) break;
            t->args.push_back(parse_expr());
        }
        return t;
    }

    ExprPtr parse_expr() { return parse_or_cond(true); }

    // or_expr [if or_expr [else expr]]
    ExprPtr parse_or_cond(bool with_cond) {
        Nest nest(*this);
        ExprPtr e = parse_or();
        while (with_cond && is_name("if")) {
            const int line = next().line;
            auto c = make(Expr::Op::cond, line);
            c->args.push_back(parse_or());
            c->args.push_back(std::move(e));
            c->args.push_back(accept_name("else") ? parse_or_cond(true) : nullptr);
            e = std::move(c);
        }
        return e;
    }

    ExprPtr parse_or() {
        ExprPtr e = parse_and();
        while (is_name("or")) {
            auto o = make(Expr::Op::or_, next().line);
            o->args.push_back(std::move(e));
            o->args.push_back(parse_and());
            e = std::move(o);
        }
        return e;
    }

    ExprPtr parse_and() {
        ExprPtr e = parse_not();
        while (is_name("and")) {
            auto o = make(Expr::Op::and_, next().line);
            o->args.push_back(std::move(e));
            o->args.push_back(parse_not());
            e = std::move(o);
        }
        return e;
    }

    ExprPtr parse_not() {
        Nest nest(*this);
        if (is_name("not")) {
            auto o = make(Expr::Op::not_, next().line);
            o->args.push_back(parse_not());
            return o;
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        ExprPtr e = parse_math1();
        ExprPtr result;
        while (true) {
            std::string op;
            bool negated = false;
            if (peek().kind == Tok::op &&
                (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
                op = next().text;
            } else if (is_name("in")) {
                next();
                op = "in";
            } else if (is_name("not") && is_name("in", 1)) {
                next();
                next();
                op = "in";
                negated = true;
            } else {
                break;
            }
            auto b = make(Expr::Op::binary, peek().line);
            b->name = op;
            b->negated = negated;
            ExprPtr rhs = parse_math1();
            // a < b < c: (a < b) and (b < c); the middle operand is evaluated twice (no side effects here).
            b->args.push_back(result ? clone(*e) : std::move(e));
            b->args.push_back(std::move(rhs));
            e = clone(*b->args[1]);
            if (!result) {
                result = std::move(b);
            } else {
                auto a = make(Expr::Op::and_, b->line);
                a->args.push_back(std::move(result));
                a->args.push_back(std::move(b));
                result = std::move(a);
            }
        }
        return result ? std::move(result) : std::move(e);
    }

    ExprPtr clone(const Expr &x) {
        if (++nodes_in_tag_ > kMaxNodesPerTag)
            error(fmt::format("an expression of over {} parts", kMaxNodesPerTag));
        auto c = std::make_unique<Expr>();
        c->op = x.op;
        c->negated = x.negated;
        c->line = x.line;
        c->value = x.value;
        c->name = x.name;
        for (const auto &a : x.args) c->args.push_back(a ? clone(*a) : nullptr);
        for (const auto &[k, v] : x.kwargs) c->kwargs.emplace_back(k, v ? clone(*v) : nullptr);
        return c;
    }

    ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, int line) {
        auto e = make(Expr::Op::binary, line);
        e->name = std::move(op);
        e->args.push_back(std::move(a));
        e->args.push_back(std::move(b));
        return e;
    }

    ExprPtr parse_math1() {
        ExprPtr e = parse_concat();
        while (is_op("+") || is_op("-")) {
            const Token t = next();
            e = binary(t.text, std::move(e), parse_concat(), t.line);
        }
        return e;
    }

    ExprPtr parse_concat() {
        ExprPtr e = parse_math2();
        while (is_op("~")) {
            const Token t = next();
            e = binary("~", std::move(e), parse_math2(), t.line);
        }
        return e;
    }

    ExprPtr parse_math2() {
        ExprPtr e = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            const Token t = next();
            e = binary(t.text, std::move(e), parse_pow(), t.line);
        }
        return e;
    }

    ExprPtr parse_pow() {
        ExprPtr e = parse_unary(true);
        while (is_op("**")) {
            const Token t = next();
            e = binary("**", std::move(e), parse_unary(true), t.line);
        }
        return e;
    }

    ExprPtr parse_unary(bool with_filter) {
        Nest nest(*this);
        if (is_op("-") || is_op("+")) {
            const Token t = next();
            auto u = make(t.text == "-" ? Expr::Op::neg : Expr::Op::pos, t.line);
            u->args.push_back(parse_unary(false));
            return with_filter ? parse_filter_expr(std::move(u)) : std::move(u);
        }
        ExprPtr e = parse_postfix(parse_primary());
        return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
    }

    ExprPtr parse_primary() {
        const Token t = next();
        switch (t.kind) {
            case Tok::name: {
                if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
                    auto e = make(Expr::Op::literal, t.line);
                    e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
                    return e;
                }
                if (t.text == "none" || t.text == "None") {
                    auto e = make(Expr::Op::literal, t.line);
                    e->value = Value::none();
                    return e;
                }
                auto e = make(Expr::Op::name, t.line);
                e->name = t.text;
                return e;
            }
            case Tok::string: {
                std::string s = t.text;
                while (peek().kind == Tok::string) s += next().text;  // adjacent literals join
                auto e = make(Expr::Op::literal, t.line);
                e->value = Value::string(std::move(s));
                return e;
            }
            case Tok::integer: {
                auto e = make(Expr::Op::literal, t.line);
                e->value = Value::integer(t.i);
                return e;
            }
            case Tok::number: {
                auto e = make(Expr::Op::literal, t.line);
                e->value = Value::number(t.d);
                return e;
            }
            case Tok::op:
                if (t.text == "(") {
                    if (accept_op(")")) return make(Expr::Op::tuple, t.line);
                    ExprPtr first = parse_expr();
                    if (accept_op(")")) return first;
                    auto tup = make(Expr::Op::tuple, t.line);
                    tup->args.push_back(std::move(first));
                    while (accept_op(",")) {
                        if (is_op(")")) break;
                        tup->args.push_back(parse_expr());
                    }
                    expect_op(")");
                    return tup;
                }
                if (t.text == "[") {
                    auto l = make(Expr::Op::list, t.line);
                    while (!accept_op("]")) {
                        l->args.push_back(parse_expr());
                        if (!is_op("]")) expect_op(",");
                    }
                    return l;
                }
                if (t.text == "{") {
                    auto d = make(Expr::Op::dict, t.line);
                    while (!accept_op("}")) {
                        d->args.push_back(parse_expr());
                        expect_op(":");
                        d->args.push_back(parse_expr());
                        if (!is_op("}")) expect_op(",");
                    }
                    return d;
                }
                break;
            default:
                break;
        }
        fail(fmt::format("line {}: unexpected {}", t.line, describe(t)));
    }

    void parse_call_args(Expr &call) {
        expect_op("(");
        while (!accept_op(")")) {
            if (peek().kind == Tok::name && is_op("=", 1)) {
                std::string k = next().text;
                next();
                call.kwargs.emplace_back(std::move(k), parse_expr());
            } else {
                if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
                call.args.push_back(parse_expr());
            }
            if (!is_op(")")) expect_op(",");
        }
    }

    ExprPtr parse_postfix(ExprPtr e) {
        while (true) {
            if (is_op(".")) {
                const int line = next().line;
                auto a = make(Expr::Op::attr, line);
                if (peek().kind == Tok::integer) {
                    a->op = Expr::Op::item;
                    auto idx = make(Expr::Op::literal, line);
                    idx->value = Value::integer(next().i);
                    a->args.push_back(std::move(e));
                    a->args.push_back(std::move(idx));
                } else {
                    a->name = expect_name();
                    a->args.push_back(std::move(e));
                }
                e = std::move(a);
            } else if (is_op("[")) {
                const int line = next().line;
                ExprPtr parts[3];
                bool is_slice = false;
                for (int part = 0; part < 3; ++part) {
                    if (!is_op(":") && !is_op("]")) parts[part] = parse_expr();
                    if (part < 2 && accept_op(":")) {
                        is_slice = true;
                        continue;
                    }
                    break;
                }
                expect_op("]");
                if (is_slice) {
                    auto s = make(Expr::Op::slice, line);
                    s->args.push_back(std::move(e));
                    for (auto &p : parts) s->args.push_back(std::move(p));
                    e = std::move(s);
                } else {
                    if (!parts[0]) error("expected a subscript");
                    auto s = make(Expr::Op::item, line);
                    s->args.push_back(std::move(e));
                    s->args.push_back(std::move(parts[0]));
                    e = std::move(s);
                }
            } else if (is_op("(")) {
                auto c = make(Expr::Op::call, peek().line);
                c->args.push_back(std::move(e));
                parse_call_args(*c);
                e = std::move(c);
            } else {
                return e;
            }
        }
    }

    ExprPtr parse_filter_expr(ExprPtr e) {
        while (true) {
            if (is_op("|")) {
                next();
                e = parse_postfix(parse_one_filter(std::move(e)));
            } else if (is_name("is")) {
                const int line = next().line;
                auto t = make(Expr::Op::test, line);
                t->negated = accept_name("not");
                t->name = expect_name();
                t->args.push_back(std::move(e));
                if (is_op("(")) {
                    parse_call_args(*t);
                } else if (peek().kind == Tok::string || peek().kind == Tok::integer ||
                           peek().kind == Tok::number ||
                           (peek().kind == Tok::name && !is_name("else") && !is_name("or") &&
                            !is_name("and")) ||
                           is_op("[") || is_op("{")) {
                    // "is equalto 3", "is sameas none": one argument without brackets (jinja2's rule, so
                    // "x is defined if y" is an error there and here).
                    if (is_name("is")) error("you cannot chain multiple tests with is");
                    t->args.push_back(parse_postfix(parse_primary()));
                }
                e = std::move(t);
            } else {
                return e;
            }
        }
    }

    // Nesting of expressions and statements, bounded so that a hostile template cannot overflow the stack.
    struct Nest {
        Parser &p;
        explicit Nest(Parser &parser) : p(parser) {
            if (++p.depth_ > kMaxNesting) p.error(fmt::format("nested over {} deep", kMaxNesting));
        }
        ~Nest() { --p.depth_; }
    };
    static constexpr int kMaxNesting = 200;
    static constexpr int kMaxNodesPerTag = 2000;
    int nodes_in_tag_ = 0;

    std::vector<Token> t_;
    size_t k_ = 0;
    int depth_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse_program(std::string_view source) {
    Lexer lexer(source);
    Parser parser(lexer.run());
    return parser.run();
}

}  // namespace td::jinja
