"""Container images on the client side: the engine, build and push (any registry or ECR),
and the command line that runs a node's agent in a container.
"""
