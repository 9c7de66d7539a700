"""The papers' reproductions, importable from a checkout (``reproductions.<claim>.<module>``).

One folder per claim: a README (claim, set-up, the paper's numbers), a papermill notebook, the results
it wrote, and the modules its notebook and worker processes import. ``_common`` holds the papermill
driver (``pipelab reproduce``) and the report helpers they share. Nothing in ``pipelab/`` imports this
package.
"""
