// ESM test files (.mjs): run with NODE_OPTIONS=--experimental-vm-modules.
export default {
  testMatch: ['**/*.test.mjs'],
}
