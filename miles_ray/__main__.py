from miles_ray.cli.app import run

run()
