// JSON values for AssemblyScript workflows: a small parser and a compact writer.
//
// Objects keep their keys in insertion order, and stringify() writes compact JSON the way
// the Python SDK does (json.dumps with separators (",", ":") and ensure_ascii=False), so a
// workflow's result reads the same in every language.

export const enum Kind {
  Null,
  Bool,
  Int,
  Float,
  String,
  Array,
  Object,
}

export class Value {
  kind: Kind = Kind.Null;
  b: bool = false;
  i: i64 = 0;
  f: f64 = 0;
  s: string = "";
  items: Value[] = [];
  keys: string[] = [];

  static null(): Value {
    return new Value();
  }
  static bool(b: bool): Value {
    const v = new Value();
    v.kind = Kind.Bool;
    v.b = b;
    return v;
  }
  static int(i: i64): Value {
    const v = new Value();
    v.kind = Kind.Int;
    v.i = i;
    return v;
  }
  static float(f: f64): Value {
    const v = new Value();
    v.kind = Kind.Float;
    v.f = f;
    return v;
  }
  static str(s: string): Value {
    const v = new Value();
    v.kind = Kind.String;
    v.s = s;
    return v;
  }
  static array(items: Value[] = []): Value {
    const v = new Value();
    v.kind = Kind.Array;
    v.items = items;
    return v;
  }
  static object(): Value {
    const v = new Value();
    v.kind = Kind.Object;
    return v;
  }
  static strings(items: string[]): Value {
    const out: Value[] = [];
    for (let i = 0; i < items.length; i++) out.push(Value.str(items[i]));
    return Value.array(out);
  }

  get isNull(): bool {
    return this.kind == Kind.Null;
  }

  /** The member `key` of an object (a null value when missing or not an object). */
  get(key: string): Value {
    if (this.kind == Kind.Object) {
      for (let i = 0; i < this.keys.length; i++) if (this.keys[i] == key) return this.items[i];
    }
    return new Value();
  }

  /** Set `key` of an object (replacing a member of that name); returns this, to chain. */
  set(key: string, value: Value): Value {
    if (this.kind != Kind.Object) return this;
    for (let i = 0; i < this.keys.length; i++) {
      if (this.keys[i] == key) {
        this.items[i] = value;
        return this;
      }
    }
    this.keys.push(key);
    this.items.push(value);
    return this;
  }
  setString(key: string, s: string): Value {
    return this.set(key, Value.str(s));
  }
  setInt(key: string, i: i64): Value {
    return this.set(key, Value.int(i));
  }

  /** The item `index` of an array (a null value when missing). */
  at(index: i32): Value {
    if (this.kind == Kind.Array && index >= 0 && index < this.items.length) return this.items[index];
    return new Value();
  }
  push(value: Value): Value {
    this.items.push(value);
    return this;
  }

  /** The text of a string value ("" for other kinds). */
  asString(): string {
    return this.kind == Kind.String ? this.s : "";
  }
  asInt(): i64 {
    if (this.kind == Kind.Int) return this.i;
    if (this.kind == Kind.Float) return <i64>this.f;
    return 0;
  }
  asFloat(): f64 {
    if (this.kind == Kind.Float) return this.f;
    if (this.kind == Kind.Int) return <f64>this.i;
    return 0;
  }
  asBool(): bool {
    return this.kind == Kind.Bool && this.b;
  }

  stringify(): string {
    const parts: string[] = [];
    write(parts, this);
    return parts.join("");
  }
}

const HEX = "0123456789abcdef";

export function quote(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c == 0x22) out += '\\"';
    else if (c == 0x5c) out += "\\\\";
    else if (c == 0x0a) out += "\\n";
    else if (c == 0x0d) out += "\\r";
    else if (c == 0x09) out += "\\t";
    else if (c == 0x08) out += "\\b";
    else if (c == 0x0c) out += "\\f";
    else if (c < 0x20) out += "\\u00" + HEX.charAt(c >> 4) + HEX.charAt(c & 15);
    else out += String.fromCharCode(c);
  }
  return out + '"';
}

function write(parts: string[], v: Value): void {
  switch (v.kind) {
    case Kind.Null:
      parts.push("null");
      break;
    case Kind.Bool:
      parts.push(v.b ? "true" : "false");
      break;
    case Kind.Int:
      parts.push(v.i.toString());
      break;
    case Kind.Float:
      if (!isFinite(v.f)) parts.push("null");
      else if (v.f == Math.floor(v.f) && Math.abs(v.f) < 1e16) parts.push((<i64>v.f).toString() + ".0");
      else parts.push(v.f.toString());
      break;
    case Kind.String:
      parts.push(quote(v.s));
      break;
    case Kind.Array:
      parts.push("[");
      for (let i = 0; i < v.items.length; i++) {
        if (i > 0) parts.push(",");
        write(parts, v.items[i]);
      }
      parts.push("]");
      break;
    default:
      parts.push("{");
      for (let i = 0; i < v.keys.length; i++) {
        if (i > 0) parts.push(",");
        parts.push(quote(v.keys[i]));
        parts.push(":");
        write(parts, v.items[i]);
      }
      parts.push("}");
  }
}

/** Parse a JSON document; null when the text is not JSON. */
export function parse(text: string): Value | null {
  const p = new Parser(text);
  const v = p.value(0);
  if (v === null) return null;
  p.ws();
  return p.i == text.length ? v : null;
}

class Parser {
  i: i32 = 0;
  constructor(public s: string) {}

  ws(): void {
    while (this.i < this.s.length) {
      const c = this.s.charCodeAt(this.i);
      if (c != 0x20 && c != 0x09 && c != 0x0a && c != 0x0d) break;
      this.i++;
    }
  }
  eat(lit: string): bool {
    if (this.s.substr(this.i, lit.length) == lit) {
      this.i += lit.length;
      return true;
    }
    return false;
  }
  value(depth: i32): Value | null {
    if (depth > 128) return null;
    this.ws();
    if (this.i >= this.s.length) return null;
    const c = this.s.charCodeAt(this.i);
    if (c == 0x6e) return this.eat("null") ? Value.null() : null;
    if (c == 0x74) return this.eat("true") ? Value.bool(true) : null;
    if (c == 0x66) return this.eat("false") ? Value.bool(false) : null;
    if (c == 0x22) {
      const s = this.string();
      return s === null ? null : Value.str(s);
    }
    if (c == 0x5b) {
      this.i++;
      const out = Value.array();
      this.ws();
      if (this.eat("]")) return out;
      while (true) {
        const item = this.value(depth + 1);
        if (item === null) return null;
        out.items.push(item);
        this.ws();
        if (this.eat(",")) continue;
        if (this.eat("]")) return out;
        return null;
      }
    }
    if (c == 0x7b) {
      this.i++;
      const out = Value.object();
      this.ws();
      if (this.eat("}")) return out;
      while (true) {
        this.ws();
        if (this.i >= this.s.length || this.s.charCodeAt(this.i) != 0x22) return null;
        const key = this.string();
        if (key === null) return null;
        this.ws();
        if (!this.eat(":")) return null;
        const item = this.value(depth + 1);
        if (item === null) return null;
        out.set(key, item); // a repeated key keeps the last value, as Python's json does
        this.ws();
        if (this.eat(",")) continue;
        if (this.eat("}")) return out;
        return null;
      }
    }
    return this.number();
  }
  number(): Value | null {
    const start = this.i;
    let float = false;
    while (this.i < this.s.length) {
      const c = this.s.charCodeAt(this.i);
      if (c == 0x2e || c == 0x65 || c == 0x45) float = true;
      else if (!((c >= 0x30 && c <= 0x39) || c == 0x2d || c == 0x2b)) break;
      this.i++;
    }
    if (this.i == start) return null;
    const text = this.s.substring(start, this.i);
    if (!float && text.length < 19) return Value.int(I64.parseInt(text));
    return Value.float(F64.parseFloat(text));
  }
  hex4(): i32 {
    if (this.i + 4 > this.s.length) return -1;
    let v = 0;
    for (let k = 0; k < 4; k++) {
      const c = this.s.charCodeAt(this.i++);
      let d = -1;
      if (c >= 0x30 && c <= 0x39) d = c - 0x30;
      else if (c >= 0x61 && c <= 0x66) d = c - 0x61 + 10;
      else if (c >= 0x41 && c <= 0x46) d = c - 0x41 + 10;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }
  string(): string | null {
    this.i++; // the opening quote
    let out = "";
    let start = this.i;
    while (this.i < this.s.length) {
      const c = this.s.charCodeAt(this.i);
      if (c == 0x22) {
        out += this.s.substring(start, this.i);
        this.i++;
        return out;
      }
      if (c < 0x20) return null;
      if (c != 0x5c) {
        this.i++;
        continue;
      }
      out += this.s.substring(start, this.i);
      this.i++;
      if (this.i >= this.s.length) return null;
      const e = this.s.charCodeAt(this.i++);
      if (e == 0x6e) out += "\n";
      else if (e == 0x72) out += "\r";
      else if (e == 0x74) out += "\t";
      else if (e == 0x62) out += "\b";
      else if (e == 0x66) out += "\f";
      else if (e == 0x75) {
        const code = this.hex4(); // UTF-16 code units: surrogate pairs join by themselves
        if (code < 0) return null;
        out += String.fromCharCode(code);
      } else if (e == 0x22 || e == 0x5c || e == 0x2f) out += String.fromCharCode(e);
      else return null;
      start = this.i;
    }
    return null;
  }
}
