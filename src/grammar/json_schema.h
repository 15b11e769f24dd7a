// JSON Schema to grammar, for structured output. The grammar produces a subset of the instances the schema accepts,
// always valid ones, written compactly by default (no whitespace), properties in the schema's order.
//
//   FATHOM_ASSIGN_OR_RETURN(Grammar g, JsonSchemaToGrammar(schema, JsonSchemaOptions{}));
//   FATHOM_ASSIGN_OR_RETURN(Grammar any, AnyJsonGrammar(JsonSchemaOptions{}, /*object_only=*/true));  // json_object
//
// Covered: type (one or a list), properties, required, additionalProperties (false, true or a schema; when absent
// beside `properties` or `patternProperties`, no other property is written; keys of extra properties are never one
// of `properties`), patternProperties where no written key can match (ignored), items,
// prefixItems (and draft-4 array `items` with additionalItems), minItems/maxItems, enum, const, anyOf, oneOf (as
// anyOf), allOf of object schemas that merge without conflict, $ref into the document (`#`, `#/$defs/..`,
// `#/definitions/..`, any JSON pointer) including recursion, minLength/maxLength, pattern, the formats date-time,
// date, time, uuid, email, uri, uri-reference, hostname, ipv4, ipv6 (other formats are annotations, and so is a format
// beside a pattern: the pattern is written), propertyNames (of type string; an enum, pattern or format keys the
// extra properties of an object that declares none), integer bounds up to 64 bits (minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, draft-4 boolean exclusives) and number bounds (integral
// bounds from 0 up take decimals; otherwise only the integers in range are written), uniqueItems (as at most one
// item), minProperties (the first optional properties become required). Long strings and arrays are written up to
// a cap (256 characters, 64 with a pattern or a format, 64 items) when the schema allows more; control characters other
// than tab, newline and carriage return are never written inside a pattern. Annotations ($schema, title, description,
// default, examples, ...) and unknown non-standard keywords are ignored. Validation keywords that are not covered (not,
// if/then/else, dependencies, contains, multipleOf, maxProperties below the property count, ...) are
// refused: kInvalidArgument naming the keyword and where it is.
#pragma once

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "grammar/grammar.h"

namespace fathom::grammar {

struct JsonSchemaOptions {
  // Whitespace between tokens: none (compact), or up to this many of space, tab and newline at each place.
  int max_whitespace = 0;
  // Bounds: nesting of schemas while converting, and the size of `enum`s.
  int max_depth = 64;
};

// `schema` as an ordered_json, so that properties keep their order: ordered_json::parse(text).
StatusOr<Grammar> JsonSchemaToGrammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options);
// Any JSON value, or any JSON object (response_format json_object).
Grammar AnyJsonGrammar(const JsonSchemaOptions& options, bool object_only);

}  // namespace fathom::grammar
