"""The bottom layer: errors, dtypes, bit packing, the Problem record, capability rules, the
machine's fingerprint, config records and the shared names. It imports nothing else of the
package and no GPU library."""
