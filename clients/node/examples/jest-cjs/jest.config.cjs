// The examples require the package by its name, as a project that installed it does. Here the
// name is the package itself, which jest's CommonJS resolver does not look up (Node's
// self-reference), so it is mapped to the CommonJS entry. An installed package needs no map.
module.exports = {
  moduleNameMapper: { '^@pglease/client$': '<rootDir>/../../lib/index.cjs' },
}
