#!/usr/bin/env node
// A counter board as an MCP server over stdio (tests/mcp_servers/counters-node, packaged for npm): Node.js
// standard library only; the store is SQLite at $TRAJFORGE_STORE, reached through the sqlite3 program.
"use strict";
const readline = require("readline");
const { execFileSync } = require("child_process");

const STORE = process.env.TRAJFORGE_STORE;
const TOOLS = [
  { name: "list_counters", description: "Every counter and its value.",
    inputSchema: { type: "object", properties: {}, additionalProperties: false } },
  { name: "set_counter", description: "Set the value of a named counter.",
    inputSchema: { type: "object", required: ["name", "value"], additionalProperties: false,
                   properties: { name: { type: "string", pattern: "^[a-z]+$" }, value: { type: "integer" } } } },
];

function sql(statement) {
  return execFileSync("sqlite3", ["-json", STORE, statement], { encoding: "utf8" }).trim();
}

function call(name, args) {
  if (name === "list_counters") {
    const rows = JSON.parse(sql("SELECT name, value FROM counters ORDER BY name") || "[]");
    return Object.fromEntries(rows.map((r) => [r.name, r.value]));
  }
  // the schema allows only a lowercase name and an integer: safe to put in the statement
  const out = sql(`UPDATE counters SET value = ${args.value} WHERE name = '${args.name}' RETURNING name`);
  if (!out) throw new Error(`no counter '${args.name}'`);
  return { [args.name]: args.value };
}

function invalid(name, args) {
  const tool = TOOLS.find((t) => t.name === name);
  if (!tool) return `unknown tool ${JSON.stringify(name)}`;
  if (typeof args !== "object" || args === null || Array.isArray(args)) return "arguments must be an object";
  if (name === "set_counter" && !(typeof args.name === "string" && /^[a-z]+$/.test(args.name)
      && Number.isInteger(args.value) && Object.keys(args).length === 2)) return "set_counter takes {name, value}";
  if (name === "list_counters" && Object.keys(args).length) return "list_counters takes no arguments";
  return null;
}

function answer(msg) {
  const { id, method, params = {} } = msg;
  if (id === undefined) return null; // a notification
  if (method === "initialize")
    return { id, result: { protocolVersion: params.protocolVersion || "2025-06-18",
                           capabilities: { tools: {} }, serverInfo: { name: "counters-mcp", version: "1.0.0" } } };
  if (method === "ping") return { id, result: {} };
  if (method === "tools/list") return { id, result: { tools: TOOLS } };
  if (method === "tools/call") {
    const why = invalid(params.name, params.arguments || {});
    if (why) return { id, error: { code: -32602, message: why } };
    try {
      const data = call(params.name, params.arguments || {});
      return { id, result: { content: [{ type: "text", text: JSON.stringify(data) }], structuredContent: data,
                             isError: false } };
    } catch (err) {
      return { id, result: { content: [{ type: "text", text: `error: ${err.message}` }], isError: true } };
    }
  }
  return { id, error: { code: -32601, message: `no method ${method}` } };
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  if (!line.trim()) return;
  let reply;
  try {
    reply = answer(JSON.parse(line));
  } catch (err) {
    reply = { id: null, error: { code: -32700, message: `parse error: ${err.message}` } };
  }
  if (reply) process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...reply }) + "\n");
});
