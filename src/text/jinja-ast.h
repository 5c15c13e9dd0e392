// The parsed form of a Jinja template: expressions and statements. Internal to text/jinja-*.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja-value.h"

namespace td::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
    enum class Op : uint8_t {
        literal,  // value
        name,     // name
        attr,     // args[0].name
        item,     // args[0][args[1]]
        slice,    // args[0][args[1]:args[2]:args[3]] (any of 1..3 may be null)
        call,     // args[0](args[1..], kwargs)
        filter,   // args[0] | name(args[1..], kwargs)
        test,     // args[0] is [not] name(args[1..])
        not_,     // not args[0]
        neg,      // -args[0]
        pos,      // +args[0]
        binary,   // args[0] name args[1]: + - * / // % ** ~ == != < <= > >= in
        and_,
        or_,
        cond,   // args[1] if args[0] else args[2] (args[2] null: undefined)
        list,   // [args...]
        tuple,  // (args...)
        dict,   // {args[0]: args[1], ...}
    };
    Op op = Op::literal;
    bool negated = false;  // test: "is not"; binary in: "not in"
    int line = 0;
    Value value;
    std::string name;
    std::vector<ExprPtr> args;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using Body = std::vector<Node>;

struct Node {
    enum class Kind : uint8_t {
        text,          // text
        output,        // {{ expr }}
        if_,           // branches
        for_,          // for targets in expr [if filter]: body [else else_body]
        set,           // set targets = expr; attr not empty: set targets[0].attr = expr
        set_block,     // {% set targets[0] %}body{% endset %}, filtered through filter when present
        macro,         // macro name(params) body
        filter_block,  // {% filter f %}body{% endfilter %}: filter's args[0] is a placeholder
        break_,
        continue_,
        scope,  // body rendered as is ({% generation %})
    };
    Kind kind = Kind::text;
    int line = 0;
    std::string text;  // text; macro name; set attr
    ExprPtr expr;      // output, for iterable, set value, filter
    ExprPtr loop_filter;
    std::vector<std::string> targets;
    std::vector<std::pair<ExprPtr, Body>> branches;  // if: (condition, body); condition null for else
    Body body, else_body;
    std::vector<std::pair<std::string, ExprPtr>> params;  // macro: (name, default or null)
};

struct Program {
    Body body;
};

// Parses a template; throws Error with the line on bad syntax.
std::unique_ptr<Program> parse_program(std::string_view source);

}  // namespace td::jinja
